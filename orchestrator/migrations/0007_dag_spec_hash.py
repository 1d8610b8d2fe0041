from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0006_task_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="dag",
            name="spec_hash",
            field=models.CharField(blank=True, default="", editable=False, max_length=64),
        ),
    ]
