"""Results between tasks and mapped tasks: a task instance's result, its map_index and item, a
task's expand; one task instance per run, task and map_index."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0004_backfills'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='expand',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='taskinstance',
            name='map_index',
            field=models.IntegerField(default=-1),
        ),
        migrations.AddField(
            model_name='taskinstance',
            name='result',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='taskinstance',
            name='map_item',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RemoveConstraint(
            model_name='taskinstance',
            name='ti_unique_per_run',
        ),
        migrations.AddConstraint(
            model_name='taskinstance',
            constraint=models.UniqueConstraint(fields=('dag_run', 'task_id', 'map_index'), name='ti_unique_per_run_map_index'),
        ),
    ]
