module github.com/alternayte/queuebox/clients/go

go 1.19

// The library needs only the standard library (database/sql); the
// application brings its driver.  These are the tests' drivers, at the
// versions the tests ran with (Debian 12's packages: clients/go/test.sh).
require (
	github.com/denisenkom/go-mssqldb v0.0.0-20170717035057-8fccfc84e623
	github.com/lib/pq v1.10.7
)

require (
	golang.org/x/crypto v0.4.0 // indirect
	golang.org/x/net v0.7.0 // indirect
)
