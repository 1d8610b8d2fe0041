"""The worker process (`manage.py run_worker`): RQ's loop with N slots, each slot a thread that
claims an attempt and supervises its task process, and the threads every slot shares
(heartbeats, spool delivery, the reaper). Nothing here runs in the fork server or a task."""
