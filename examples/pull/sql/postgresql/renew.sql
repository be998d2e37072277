-- Extend the lease of a held message by $3 ms; renew every third of the lease.
-- false: another worker owns the message now, stop the work.
-- $1 bigint id, $2 uuid claim_token, $3 int lease in milliseconds
SELECT queuebox.inbox_renew($1, $2, $3);
