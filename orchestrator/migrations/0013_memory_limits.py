# Memory limits: the limit a task's later attempts run with once one went past its own, and
# each attempt's limit and measured peak.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0012_attempt_item'),
    ]

    operations = [
        migrations.AddField(
            model_name='taskinstance',
            name='memory_limit_mib',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='taskattempt',
            name='memory_limit_mib',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='taskattempt',
            name='peak_memory_mib',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
