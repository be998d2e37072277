// procedures called by name (CommandType.StoredProcedure)
internal static class Broken
{
    internal static string Take(bool sqlServer) => sqlServer ? "queuebox.take" : "SELECT * FROM queuebox.take($1, $2)";

    // not a procedure of the schema: line 7
    internal static string Give(bool sqlServer) => sqlServer ? "queuebox.give" : "SELECT queuebox.give($1)";

    internal static string Verbatim => @"queuebox.take";
}
