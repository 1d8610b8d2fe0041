import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0014_waits"),
    ]

    operations = [
        migrations.AddField(
            model_name="dag",
            name="owner",
            field=models.CharField(
                blank=True,
                default="",
                help_text="The team that owns it, e.g. data-team.",
                max_length=100,
                validators=[django.core.validators.RegexValidator("^[A-Za-z0-9_.\\-]{1,100}$", "Use 1-100 letters, digits, '_', '.' or '-'.")],
            ),
        ),
    ]
