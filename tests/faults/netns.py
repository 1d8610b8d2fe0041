"""Real network partitions: a worker "host" in a network namespace of its own.

    with Partition() as net:          # skips the test when it cannot (not root, no ip/nft)
        net.expose(5432)              # a forwarder on the host side of the veth to 127.0.0.1:5432
        net.run([...])                # a process inside the namespace
        net.drop(port, "both")        # packets between the worker and that service dropped
        net.heal()

The namespace is joined to the host by a veth pair (10.213.N.1 on the host side, .2 inside).
The services the worker uses are reached through forwarders (`TcpProxy`) listening on the
host side's address, so the shared servers themselves are never firewalled, stopped or touched:
packets are dropped by an nftables table inside the worker's namespace, on the way out
(worker -> service), on the way in (service -> worker), or both. A dropped packet is simply
lost: no reset, no refusal, exactly what a partition looks like to the worker.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from typing import Literal

import pytest

from tests.worker.proxy import TcpProxy

Direction = Literal["out", "in", "both"]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


def _ensure_tools() -> None:
    """`ip` and `nft` from Debian's packages, installed when missing; skip when they cannot be."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        if shutil.which("apt-get") is None:
            pytest.skip("no ip/nft and no apt-get to install them")
        _run("apt-get", "install", "-y", "--no-install-recommends", "iproute2", "nftables")
        if shutil.which("ip") is None or shutil.which("nft") is None:
            pytest.skip("could not install iproute2 and nftables")


class Partition:
    def __init__(self) -> None:
        self.id = random.randrange(1, 250)
        self.ns = f"orch-part-{os.getpid()}-{self.id}"
        self.host_if = f"vh{os.getpid() % 100000}x{self.id}"[:15]
        self.worker_if = f"vw{os.getpid() % 100000}x{self.id}"[:15]
        self.host_ip = f"10.213.{self.id}.1"
        self.worker_ip = f"10.213.{self.id}.2"
        self.proxies: list[TcpProxy] = []
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Partition:
        _ensure_tools()
        steps = [
            ("ip", "netns", "add", self.ns),
            ("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.worker_if),
            ("ip", "link", "set", self.worker_if, "netns", self.ns),
            ("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
            ("ip", "link", "set", self.host_if, "up"),
            ("ip", "-n", self.ns, "addr", "add", f"{self.worker_ip}/30", "dev", self.worker_if),
            ("ip", "-n", self.ns, "link", "set", self.worker_if, "up"),
            ("ip", "-n", self.ns, "link", "set", "lo", "up"),
            ("ip", "netns", "exec", self.ns, "nft", "add", "table", "inet", "cut"),
            ("ip", "netns", "exec", self.ns, "nft", "add chain inet cut out { type filter hook output priority 0 ; }"),
            ("ip", "netns", "exec", self.ns, "nft", "add chain inet cut in { type filter hook input priority 0 ; }"),
        ]
        for step in steps:
            done = _run(*step)
            if done.returncode != 0:
                self.__exit__(None, None, None)
                pytest.skip(f"cannot build a network namespace ({' '.join(step)}): {done.stderr.strip()}")
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for proxy in self.proxies:
            proxy.cut()
        _run("ip", "link", "del", self.host_if)
        _run("ip", "netns", "del", self.ns)

    def expose(self, port: int, host: str = "127.0.0.1") -> int:
        """A forwarder on the host side of the veth to host:port; returns its port."""
        proxy = TcpProxy(host, port, listen_host=self.host_ip)
        self.proxies.append(proxy)
        return proxy.port

    def run(self, argv: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside the namespace (`ip netns exec` execs it: its pid is the process's)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            **kwargs,
        )
        self.procs.append(proc)
        return proc

    def drop(self, port: int, direction: Direction = "both") -> None:
        """Drop the packets between the worker and the forwarder on `port`."""
        rules = []
        if direction in ("out", "both"):
            rules.append(f"add rule inet cut out ip daddr {self.host_ip} tcp dport {port} drop")
        if direction in ("in", "both"):
            rules.append(f"add rule inet cut in ip saddr {self.host_ip} tcp sport {port} drop")
        for rule in rules:
            done = _run("ip", "netns", "exec", self.ns, "nft", rule)
            assert done.returncode == 0, done.stderr

    def heal(self) -> None:
        for chain in ("out", "in"):
            done = _run("ip", "netns", "exec", self.ns, "nft", "flush", "chain", "inet", "cut", chain)
            assert done.returncode == 0, done.stderr


def python() -> str:
    return sys.executable
