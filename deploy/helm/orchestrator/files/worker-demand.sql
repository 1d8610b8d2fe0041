-- Workers needed by one worker Deployment: ceil((queued + running task instances of its queues)
-- / its concurrency). KEDA's postgresql scaler runs it every polling interval, with a target of
-- 1 per replica. Running tasks count too: a queue-length metric alone would see an empty queue
-- while every slot is busy and scale the busy workers away.
-- QUEUES and CONCURRENCY are filled in by the chart (templates/_helpers.tpl, orchestrator.workerDemandQuery).
SELECT CEIL(COUNT(*) / CONCURRENCY::numeric)::integer AS workers
FROM orchestrator_taskinstance
WHERE state IN ('queued', 'running') AND queue IN (QUEUES)
