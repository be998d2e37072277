-- Mark a message processed, in the transaction of the business writes.
-- false: another worker owns the message; roll the whole transaction back.
-- $1 bigint id, $2 uuid claim_token
SELECT queuebox.inbox_complete($1, $2);
