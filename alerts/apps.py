from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Runs that fail and deadlines that are missed reach the rules through the listener hooks
        # (off the caller's path); failed attempts are matched by the report, which calls the
        # recorder registered here once the failure is recorded.
        from alerts import events
        from orchestrator import listeners

        listeners.register_builtin(events.HOOKS, name="alerts")
        listeners.on_failure_recorded(events.task_failed, name="alerts")
