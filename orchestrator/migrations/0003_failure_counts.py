"""Failed attempts counted per hour (FailureCount), filled from the attempts that failed so far."""

import django.db.models.deletion
from django.db import migrations, models


def count_past_failures(apps, schema_editor):
    from orchestrator.engine import failure_counts

    failure_counts.backfill(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0002_pools_limits_circuits'),
    ]

    operations = [
        migrations.CreateModel(
            name='FailureCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField()),
                ('task_id', models.CharField(max_length=250)),
                ('category', models.CharField(max_length=64)),
                ('reason', models.CharField(max_length=64)),
                ('hostname', models.CharField(max_length=255)),
                ('fingerprint', models.CharField(max_length=12)),
                ('n', models.IntegerField()),
                ('dag', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='orchestrator.dag')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('hour', 'dag', 'task_id', 'category', 'reason', 'hostname', 'fingerprint'), name='failurecount_key')],
            },
        ),
        # One INSERT ... SELECT ... GROUP BY over the failed attempts (see failure_counts.backfill).
        migrations.RunPython(count_past_failures, migrations.RunPython.noop),
    ]
