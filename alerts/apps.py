from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Runs that fail and deadlines that are missed reach the rules through the listener hooks
        # (off the caller's path); failed attempts are matched by the report itself.
        from alerts import events
        from orchestrator import listeners

        listeners.register_builtin(events.HOOKS, name="alerts")
