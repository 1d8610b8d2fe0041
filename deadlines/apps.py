from django.apps import AppConfig


class DeadlinesConfig(AppConfig):
    name = "deadlines"
    default_auto_field = "django.db.models.BigAutoField"
