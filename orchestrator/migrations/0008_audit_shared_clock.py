# An audit entry's time comes from the shared clock (the database's), not the web host's.

import orchestrator.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0007_dag_spec_hash'),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditlog',
            name='at',
            field=models.DateTimeField(default=orchestrator.models.audit_time, editable=False),
        ),
    ]
