"""A listener for tests: records every call; a second one always raises."""
from orchestrator.listeners import hookimpl

calls: list[tuple[str, dict]] = []


@hookimpl
def on_task_instance_failed(previous_state, task_instance, error, execution_context):
    calls.append(("failed", {"previous_state": previous_state, "task_id": task_instance.task_id, "context": execution_context}))


@hookimpl
def on_task_instance_dead_lettered(task_instance, execution_context):
    calls.append(("dead_lettered", {"task_id": task_instance.task_id, "context": execution_context}))


@hookimpl
def on_task_instance_running(task_instance):
    calls.append(("running", {"task_id": task_instance.task_id}))


@hookimpl
def on_dag_run_failed(dag_run):
    calls.append(("run_failed", {"run_id": dag_run.run_id}))


class Broken:
    @hookimpl
    def on_task_instance_failed(self, previous_state, task_instance, error, execution_context):
        raise RuntimeError("a broken listener")


broken = Broken()


class Hanging:
    """Hangs in on_task_instance_running until `release` is set."""

    release = __import__("threading").Event()

    @hookimpl
    def on_task_instance_running(self, task_instance):
        self.release.wait(30)


hanging = Hanging()


@hookimpl
def on_task_instance_success(task_instance):
    calls.append(("success", {"task_id": task_instance.task_id}))
