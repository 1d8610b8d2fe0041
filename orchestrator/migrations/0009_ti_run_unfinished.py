# A run's unfinished tasks, indexed: a report's bounded looks at them read those rows, not the run's every row.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0008_audit_shared_clock'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='taskinstance',
            index=models.Index(condition=models.Q(('state__in', ['dead_letter', 'none', 'queued', 'running', 'scheduled', 'up_for_retry'])), fields=['dag_run', 'task_id'], name='ti_run_unfinished'),
        ),
    ]
