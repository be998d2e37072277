-- Claim up to @batch_size messages of pull source @source with a lease of
-- @lease_ms ms.  Run alone in its own transaction and commit before any
-- handler starts.  One claim at a time per source (an application lock):
-- after 10 s waiting for it the claim raises Msg 51000, a temporary failure:
-- wait, then claim again.  Set the driver's request timeout to 30 s or more.
-- Bind: @source NVARCHAR(200), @batch_size INT, @lease_ms INT.
-- Returns: id, claim_token, source, idempotency_key, event_type, aggregate_id,
--          payload, headers, attempt, created_at (UTC)
EXEC queuebox.inbox_claim @source = ?, @batch_size = ?, @lease_ms = ?;
