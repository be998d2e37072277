-- Give up on a message: dead is final until an operator requeues it.
-- $1 bigint id, $2 uuid claim_token, $3 text error
SELECT queuebox.inbox_dead($1, $2, $3);
