# A task instance's run has no index of its own: the unique (run, task, map_index) index serves
# every lookup by run, and with the second one PostgreSQL could pick it for a run newer than its
# statistics and read the whole run to find one task. Dropped by name (the state change alone
# would rebuild the whole table on SQLite).

import django.db.models.deletion
from django.db import migrations, models

INDEX = "orchestrator_taskinstance_dag_run_id_d7e688e6"


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0009_ti_run_unfinished'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='taskinstance',
                    name='dag_run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='task_instances', to='orchestrator.dagrun'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX "{INDEX}" ON "orchestrator_taskinstance" ("dag_run_id")',
                ),
            ],
        ),
    ]
