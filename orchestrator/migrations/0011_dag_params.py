# A DAG's run parameters: params (NAME -> JSON Schema with an optional default) and
# strict_params. Existing DAGs get none, and any conf is taken as before.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0010_ti_run_index_is_the_unique_one'),
    ]

    operations = [
        migrations.AddField(
            model_name='dag',
            name='params',
            field=models.JSONField(blank=True, default=dict, help_text='NAME: a JSON Schema with an optional default and description.'),
        ),
        migrations.AddField(
            model_name='dag',
            name='strict_params',
            field=models.BooleanField(default=False, help_text='Refuse a conf key that is not a declared param.'),
        ),
    ]
