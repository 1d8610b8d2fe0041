from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    default_auto_field = "django.db.models.BigAutoField"
