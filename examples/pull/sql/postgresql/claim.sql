-- Claim up to $2 messages of pull source $1 with a lease of $3 ms.
-- Run alone in its own transaction and commit before any handler starts.
-- $1 text source, $2 int batch size, $3 int lease in milliseconds
SELECT id, claim_token, source, idempotency_key, event_type, aggregate_id,
       payload, headers, attempt, created_at
FROM queuebox.inbox_claim($1, $2, $3);
