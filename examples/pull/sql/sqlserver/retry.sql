-- Give a message back for a later attempt: attempt + 1, due after @delay_ms ms.
-- retried = 0: another worker owns the message.
-- Bind: @id BIGINT, @claim_token UNIQUEIDENTIFIER, @delay_ms INT, @error NVARCHAR(MAX).
EXEC queuebox.inbox_retry @id = ?, @claim_token = ?, @delay_ms = ?, @error = ?;
