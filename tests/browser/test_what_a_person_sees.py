"""What a person sees in the console, asserted from the rendered page in headless Chromium:
colours as computed, words as laid out, bars as drawn, and the root cause after an operator acts.

With UPDATE_SCREENSHOTS=1 the diagnosis screenshots in docs/screenshots/ are written too.
"""
from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from orchestrator.models import AuditLog, TaskInstance
from orchestrator.operations import actions
from retries.states import Reason
from tests.api.factories import chain_dag, fail, instance, make_run
from tests.browser.conftest import own_connections
from tests.browser.story import CONFIG_MISSING, settlement_story
from tests.browser.test_console_browser import login, operator

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
SAVE = os.environ.get("UPDATE_SCREENSHOTS") == "1"
DESKTOP, PHONE = 1440, 390
THEMES = ("light", "dark")


def shoot(page, name: str) -> None:
    if SAVE:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


# Every word of every table's text, laid out: a word whose boxes lie on more than one line was
# broken mid-way. Logs (<pre>) wrap by design and are left out; hidden text has no boxes.
# Opened confirmations (details) are included: their explanations are table text too.
BROKEN_WORDS = """() => {
  const broken = [];
  for (const table of document.querySelectorAll('main table')) {
    const walker = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement.closest('pre, svg')) continue;
      // A hyphenated English word ("user-charged") may break after its hyphen, as print does;
      // any other word (an id, a date, a path) must stay on one line.
      const parts = /^[A-Za-z]+(-[A-Za-z]+)+[.,;:)]?$/;
      for (const m of node.data.matchAll(/\\S+/g)) {
        const pieces = parts.test(m[0]) ? m[0].split(/(?<=-)/) : [m[0]];
        let at = m.index;
        for (const piece of pieces) {
          const range = document.createRange();
          range.setStart(node, at);
          range.setEnd(node, at + piece.length);
          at += piece.length;
          const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.bottom)));
          if (lines.size > 1) broken.push(m[0]);
        }
      }
    }
  }
  return broken;
}"""

# A cell whose content is wider than the cell (cut off or drawn over its neighbour).
OVERFLOWING_CELLS = """() => [...document.querySelectorAll('main table td, main table th')]
  .filter(c => c.offsetParent !== null && c.scrollWidth > c.clientWidth + 1 && !c.querySelector('.table-scroll, pre'))
  .map(c => c.textContent.trim().slice(0, 40))"""

# A table is reachable when it fits the viewport, or when the box that scrolls it sideways is
# itself reachable (a table inside a scrolled table's cell scrolls with it) and wide enough.
UNREACHABLE_TABLES = """() => {
  const inView = r => r.left >= -1 && r.right <= window.innerWidth + 1;
  const reachable = el => {
    const r = el.getBoundingClientRect();
    if (inView(r)) return true;
    let box = el.parentElement;
    while (box && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) box = box.parentElement;
    return !!box && box.scrollWidth >= Math.floor(r.width) && reachable(box);
  };
  return [...document.querySelectorAll('main table')].filter(t => t.offsetParent !== null && !reachable(t))
    .map(t => (t.id || t.className) + ' ' + Math.round(t.getBoundingClientRect().left) + '..' + Math.round(t.getBoundingClientRect().right));
}"""


@pytest.mark.timeout(600)  # many page loads on a shared machine
def test_each_state_has_its_own_colour_on_the_grid_and_in_the_legend(live_server, browser_page):
    """The legend has a distinct computed colour per state, and each square on the grid has its
    state's legend colour, in both themes."""
    with own_connections():
        operator()
        states = [
            "none", "scheduled", "queued", "running", "success", "up_for_retry", "failed", "upstream_failed",
            "dead_letter", "skipped", "removed", "up_for_reschedule",
        ]  # fmt: skip
        dag = chain_dag("colours", task_ids=tuple(f"t{i}" for i in range(len(states))))
        run = make_run(dag)
        for i, state in enumerate(states):
            TaskInstance.objects.filter(dag_run=run, task_id=f"t{i}").update(state=state)
        page = browser_page
        login(page, live_server.url, "/dags/colours/")
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            page.goto(f"{live_server.url}/dags/colours/")
            legend = page.evaluate(
                "() => Object.fromEntries([...document.querySelectorAll('#grid-legend .item[data-state]')]"
                ".map(i => [i.dataset.state, getComputedStyle(i.querySelector('.sq')).backgroundColor]))"
            )
            assert sorted(legend) == sorted(states)
            colours = [c for s, c in legend.items() if s != "none"]
            assert len(set(colours)) == len(colours), f"{theme}: two states share a colour: {legend}"
            assert legend["none"] == "rgba(0, 0, 0, 0)"  # not started: an outline only
            squares = page.evaluate(
                "() => [...document.querySelectorAll('#dag-grid tbody a.sq')].map(a => [a.dataset.state, getComputedStyle(a).backgroundColor])"
            )
            assert sorted(s for s, _ in squares) == sorted(states)
            for state, colour in squares:
                assert colour == legend[state], f"{theme}: a {state} square is {colour}, its legend {legend[state]}"


@pytest.mark.timeout(600)  # many page loads on a shared machine
def test_no_word_is_broken_and_every_table_can_be_read(live_server, browser_page):
    """At 390 px and 1,440 px, on every page: no word of a table broken mid-way, no cell
    drawn past its edge, and every table either fits or scrolls sideways in its own box."""
    with own_connections():
        alice = operator(staff=True)
        story = settlement_story()
        actions.mark_failed(instance(story.poisoned, "load_ledger"), alice, note="config restored by hand; rerun tomorrow after the 06:00 import")
        page = browser_page
        login(page, live_server.url)
        run = f"/dags/settlement/runs/{story.failed.run_id}/"
        pages = ["/", "/dags/settlement/", run, f"{run}tasks/transform", "/dead-letters/", "/failures/", "/workers/", "/audit/", "/alerts/", "/approvals/",
                 f"/dags/settlement/runs/{story.poisoned.run_id}/tasks/load_ledger", "/fingerprints/9c41e07bd2aa/"]
        for width in (PHONE, DESKTOP):
            page.set_viewport_size({"width": width, "height": 900})
            for path in pages:
                page.goto(f"{live_server.url}{path}")
                page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
                assert page.evaluate(BROKEN_WORDS) == [], f"{path} at {width}px breaks words"
                assert page.evaluate(OVERFLOWING_CELLS) == [], f"{path} at {width}px has cells drawn past their edge"
                assert page.evaluate(UNREACHABLE_TABLES) == [], f"{path} at {width}px has tables out of reach"
                overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"{path} is {overflow}px wider than {width}px"


@pytest.mark.timeout(600)  # many page loads on a shared machine
def test_the_failures_chart_draws_every_bucket_on_a_labelled_time_axis(live_server, browser_page):
    with own_connections():
        operator()
        run = make_run(chain_dag("etl", retries=9))
        fail(run, "extract")
        TaskInstance.objects.filter(task_id="extract").update(next_retry_at=timezone.now() - timedelta(seconds=1))
        fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
        page = browser_page
        login(page, live_server.url, "/failures/?window=24h")
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            for window, buckets in (("24h", 25), ("1h", 61), ("7d", 8)):
                page.goto(f"{live_server.url}/failures/?window={window}")
                bars = page.evaluate(
                    "() => [...document.querySelectorAll('#failures-chart g.bucket')].map(g => ({title: g.querySelector('title').textContent,"
                    " total: +g.dataset.total, segs: [...g.querySelectorAll('rect.seg')].map(r => [r.getAttribute('class'), r.getBoundingClientRect().height, getComputedStyle(r).fill])}))"
                )
                assert len(bars) == buckets, f"{window}: {len(bars)} bars"
                assert all(bar["title"] for bar in bars)
                drawn = [bar for bar in bars if bar["total"]]
                assert len(drawn) == 1, drawn
                assert drawn[0]["total"] == 2, drawn
                # stacked: an infrastructure and an application segment, each drawn, in their own colours
                segs = {cls.split()[-1]: (height, fill) for cls, height, fill in drawn[0]["segs"]}
                assert set(segs) == {"seg-infrastructure", "seg-application"}
                assert all(h > 10 for h, _ in segs.values())
                assert segs["seg-infrastructure"][1] != segs["seg-application"][1]
                labels = page.evaluate("() => [...document.querySelectorAll('#failures-chart .ticks text')].map(t => t.textContent)")
                assert len(labels) >= 3, labels
                assert all(re.fullmatch(r"\d\d:\d\d|[A-Z][a-z]{2} \d\d", label) for label in labels), labels
                # the labels are readable: on screen, not on top of each other
                boxes = page.evaluate("() => [...document.querySelectorAll('#failures-chart .ticks text')].map(t => { const r = t.getBoundingClientRect(); return [r.left, r.right]; })")
                assert all(a[1] <= b[0] for a, b in zip(boxes, boxes[1:])), boxes
                legend = page.text_content("#failures-chart .legend")
                assert "infrastructure" in legend
                assert "application" in legend
                assert "timeout" in legend


@pytest.mark.timeout(600)  # many page loads on a shared machine
def test_the_root_cause_stays_in_view_after_clear_and_mark_failed(live_server, browser_page):
    """The dead-lettered task's own failure (category, reason, error line, poisoned) stays at the
    top of its page after a clear and after a mark failed; the actions read as actions."""
    with own_connections():
        operator()
        story = settlement_story()
        page = browser_page
        url = f"/dags/settlement/runs/{story.poisoned.run_id}/tasks/load_ledger"
        login(page, live_server.url, url)

        def cause() -> tuple[str, str, str, bool]:
            return (
                page.text_content("#cause-category"),
                page.text_content("#cause-reason"),
                page.text_content("#cause-error"),
                page.locator("#root-cause .badge.poisoned").count() == 1,
            )

        assert cause() == ("application", "task_exception", f"FileNotFoundError: {CONFIG_MISSING}", True)
        assert page.locator(".attempt .badge.poisoned").count() == 1  # on the attempt that tipped it only
        assert "poisoned" in page.text_content("#attempt-" + str(instance(story.poisoned, "load_ledger").attempt_token))
        assert re.fullmatch(r"\d+ ms over 2 attempts", page.text_content("#ti-ran").strip())
        headings = [h.strip() for h in page.locator(".attempt h3").all_text_contents()]
        assert re.match(r"Attempt 1 · user try 1 of 3", re.sub(r"\s+", " ", headings[0])), headings
        assert re.match(r"Attempt 2 · user try 2 of 3", re.sub(r"\s+", " ", headings[1])), headings

        page.click("#actions summary:has-text('Clear')")
        page.fill("#actions details[open] input[name=note]", "config restored")
        page.click("#actions details[open] button:has-text('Confirm clear')")
        page.wait_for_selector("#notice:has-text('Cleared load_ledger')")
        assert cause() == ("application", "task_exception", f"FileNotFoundError: {CONFIG_MISSING}", True)
        assert "cleared by alice" in re.sub(r"\s+", " ", page.text_content("#operator-action"))
        assert "config restored" in page.text_content("#action-note")
        page.set_viewport_size({"width": DESKTOP, "height": 1000})
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            shoot(page, f"diagnose-task-after-clear-{theme}")
        page.emulate_media(color_scheme="light")
        page.set_viewport_size({"width": PHONE, "height": 900})
        shoot(page, "diagnose-task-after-clear-390")
        page.set_viewport_size({"width": DESKTOP, "height": 1000})

        page.click("#actions summary:has-text('Mark failed')")
        page.fill("#actions details[open] input[name=note]", "ledger closed for today")
        page.click("#actions details[open] button:has-text('Confirm mark failed')")
        page.wait_for_selector("#notice:has-text('Marked load_ledger failed')")
        assert page.text_content("#ti-state") == "failed"
        assert cause() == ("application", "task_exception", f"FileNotFoundError: {CONFIG_MISSING}", True)
        assert "marked failed by alice" in re.sub(r"\s+", " ", page.text_content("#operator-action"))
        assert page.locator(".attempt .badge.poisoned").count() == 1

        # the run page says the same: the cause, then the action
        page.goto(f"{live_server.url}/dags/settlement/runs/{story.poisoned.run_id}/")
        cell = re.sub(r"\s+", " ", page.text_content("#task-load_ledger td.last-failure"))
        assert "application task_exception poisoned" in cell
        assert CONFIG_MISSING in cell
        assert "then marked failed by alice: “ledger closed for today”" in cell
        assert AuditLog.objects.filter(action="mark_failed", task_id="load_ledger").count() == 1


def _contrast(page) -> list[str]:
    """Text on badges and buttons whose contrast with its background is under 4.5:1."""
    return page.evaluate(
        """() => {
      const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
      const lum = ([r, g, b]) => [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
        .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
      const background = el => {
        for (let e = el; e; e = e.parentElement) {
          const c = rgb(getComputedStyle(e).backgroundColor);
          if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
        }
        return [255, 255, 255];
      };
      const low = [];
      for (const el of document.querySelectorAll('.state, .badge, .kind, .cat, button, summary.button')) {
        if (el.offsetParent === null || el.disabled || !el.textContent.trim()) continue;
        const fg = lum(rgb(getComputedStyle(el).color).slice(0, 3)), bg = lum(background(el));
        const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
        if (ratio < 4.5) low.push(el.textContent.trim().slice(0, 30) + ' ' + ratio.toFixed(2));
      }
      return low;
    }"""
    )


@pytest.mark.timeout(600)  # many page loads on a shared machine
def test_badges_and_buttons_read_at_4_5_to_1_in_both_themes(live_server, browser_page):
    with own_connections():
        operator(staff=True)
        story = settlement_story()
        page = browser_page
        login(page, live_server.url)
        pages = ["/", "/dags/settlement/", f"/dags/settlement/runs/{story.failed.run_id}/",
                 f"/dags/settlement/runs/{story.poisoned.run_id}/tasks/load_ledger", "/failures/", "/dead-letters/", "/audit/"]
        checked = 0
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            for path in pages:
                page.goto(f"{live_server.url}{path}")
                page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
                assert _contrast(page) == [], f"{path} in {theme}"
                checked += page.locator(".state, .badge, .kind, .cat, button.primary").count()
        assert checked > 50  # badges and primary buttons were there to check


@pytest.mark.timeout(600)  # many page loads on a shared machine
def test_the_diagnosis_screenshots(live_server, browser_page):
    """The grid with a failed and a dead-lettered task, and the run page, at desktop and phone width."""
    with own_connections():
        operator(staff=True)
        story = settlement_story()
        page = browser_page
        login(page, live_server.url)
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            page.set_viewport_size({"width": DESKTOP, "height": 900})
            page.goto(f"{live_server.url}/dags/settlement/")
            assert page.locator("#dag-grid tbody a.sq.state-dead_letter").count() == 1
            assert page.locator("#dag-grid tbody a.sq.state-failed").count() == 1
            shoot(page, f"diagnose-grid-{theme}")
            page.goto(f"{live_server.url}/dags/settlement/runs/{story.poisoned.run_id}/")
            shoot(page, f"diagnose-run-{theme}")
        page.emulate_media(color_scheme="light")
        page.set_viewport_size({"width": PHONE, "height": 900})
        for path, name in (("/dags/settlement/", "diagnose-grid-390"), (f"/dags/settlement/runs/{story.poisoned.run_id}/", "diagnose-run-390")):
            page.goto(f"{live_server.url}{path}")
            shoot(page, name)
