-- Mark a message processed, in the transaction of the business writes.
-- completed = 0: another worker owns the message; roll the whole transaction back.
-- Bind: @id BIGINT, @claim_token UNIQUEIDENTIFIER.
EXEC queuebox.inbox_complete @id = ?, @claim_token = ?;
