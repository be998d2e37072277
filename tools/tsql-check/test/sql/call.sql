-- a pull statement with ODBC markers and a parameter the procedure lacks
EXEC queuebox.take @source = ?, @batch_sise = ?;
