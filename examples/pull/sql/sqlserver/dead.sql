-- Give up on a message: dead is final until an operator requeues it.
-- dead = 0: another worker owns the message.
-- Bind: @id BIGINT, @claim_token UNIQUEIDENTIFIER, @error NVARCHAR(MAX).
EXEC queuebox.inbox_dead @id = ?, @claim_token = ?, @error = ?;
