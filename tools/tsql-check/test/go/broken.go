package broken

// outside the region: PostgreSQL's text, not checked
var postgres = "SELECT queuebox.inbox_claim($1, $2"

func sqlServerStatements() []string {
	return []string{
		"EXEC queuebox.take @source = @p1," +
			" @batch_size = @p2",
		// a comma missing between the parameters: line 11
		"EXEC queuebox.take @source = @p1" +
			" @batch_size = @p2",
		`SELECT 1 FROM sys.objects WHERE name = @p1`,
	}
}
