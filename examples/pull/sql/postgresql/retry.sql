-- Give a message back for a later attempt: attempt + 1, due after $3 ms.
-- $1 bigint id, $2 uuid claim_token, $3 int delay in milliseconds, $4 text error
SELECT queuebox.inbox_retry($1, $2, $3, $4);
