// The mssql package, loaded once and only when SQL Server is used: an optional
// peer, so that an application on PostgreSQL need not install it.

let mssqlModule;

/** The mssql module; who names the caller in the error when it is not installed. */
export async function mssqlTypes(who) {
  mssqlModule ??= import('mssql').then((m) => m.default ?? m, (e) => {
    mssqlModule = undefined;
    throw new Error(`${who}: the mssql package cannot be loaded (npm install mssql): ${e.message}`);
  });
  return mssqlModule;
}
