-- Extend the lease of a held message by @lease_ms ms; renew every third of
-- the lease.  renewed = 0: another worker owns the message now, stop the work.
-- Bind: @id BIGINT, @claim_token UNIQUEIDENTIFIER, @lease_ms INT.
EXEC queuebox.inbox_renew @id = ?, @claim_token = ?, @lease_ms = ?;
