# An attempt's item: the item a mapped instance was dispatched with, so that its history says
# which item each attempt ran with after the task expands again over another list. Attempts
# made before get their instance's item as it stands now (the best there is to know of them).

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def item_of_earlier_attempts(apps, schema_editor):
    TaskAttempt = apps.get_model("orchestrator", "TaskAttempt")
    TaskInstance = apps.get_model("orchestrator", "TaskInstance")
    item = TaskInstance.objects.filter(pk=OuterRef("task_instance_id")).values("map_item")[:1]
    TaskAttempt.objects.filter(task_instance__map_index__gte=0).update(item=Subquery(item))


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0011_dag_params'),
    ]

    operations = [
        migrations.AddField(
            model_name='taskattempt',
            name='item',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(item_of_earlier_attempts, migrations.RunPython.noop, elidable=True),
    ]
