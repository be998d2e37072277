// tools/tsql-check: every T-SQL text QueueBox sends to SQL Server, parsed by
// Microsoft's own parser (Microsoft.SqlServer.TransactSql.ScriptDom,
// TSql150Parser: SQL Server 2019's grammar).
//
//   tsql-check [--root DIR] [--manifest FILE] [--expect FILE] [--list]
//
// sources.txt beside this file says where the texts are and how each is
// taken out (README.md: the kinds).  Each text must parse; an EXEC of a
// queuebox.* procedure, and each procedure a client calls by name (RPC),
// must name a procedure that sql/sqlserver's schema creates, with
// parameters it declares.  A failure names the file, the line, the
// statement and ScriptDom's error (its number, line, column and message).
// --expect FILE: the failures must be exactly those FILE lists (the tool's
// own test: test/sources.txt holds broken inputs).  Exit 0 when all parse
// (or, with --expect, when the failures are the expected ones), 1 when not,
// 2 when the manifest or a file cannot be read.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text;
using System.Text.RegularExpressions;
using Microsoft.SqlServer.TransactSql.ScriptDom;

namespace QueueBox.TsqlCheck;

/// <summary>One text to parse: where it came from, and whether it is a procedure called by name.</summary>
internal sealed record SqlText(string File, int Line, string Where, string Sql, bool Rpc);

/// <summary>One line of a manifest.</summary>
internal sealed record Entry(string Kind, string Pattern, bool Schema, string Take, string? From, string Manifest, int ManifestLine);

/// <summary>A failure: where, and what.</summary>
internal sealed record Failure(string File, int Line, string Message, string Where, string Detail);

internal static class Program
{
    private static int Main(string[] args)
    {
        string root = Directory.GetCurrentDirectory();
        string? manifest = null, expect = null;
        bool list = false;
        for (int i = 0; i < args.Length; i++)
        {
            switch (args[i])
            {
                case "--root" when i + 1 < args.Length: root = args[++i]; break;
                case "--manifest" when i + 1 < args.Length: manifest = args[++i]; break;
                case "--expect" when i + 1 < args.Length: expect = args[++i]; break;
                case "--list": list = true; break;
                default:
                    Console.Error.WriteLine($"tsql-check: unknown argument {args[i]}; usage: tsql-check [--root DIR] [--manifest FILE] [--expect FILE] [--list]");
                    return 2;
            }
        }
        root = Path.GetFullPath(root);
        manifest ??= Path.Combine(root, "tools", "tsql-check", "sources.txt");
        try
        {
            return Run(root, manifest, expect, list);
        }
        catch (SetupException e)
        {
            Console.Error.WriteLine($"tsql-check: {e.Message}");
            return 2;
        }
    }

    private static int Run(string root, string manifest, string? expect, bool list)
    {
        var entries = Manifest.Read(manifest);
        var texts = new List<SqlText>();
        var schemaTexts = new List<SqlText>();
        int files = 0;
        foreach (var entry in entries)
        {
            var paths = Manifest.Files(root, entry);
            var found = new List<SqlText>();
            foreach (var path in paths)
            {
                string rel = Path.GetRelativePath(root, path).Replace('\\', '/');
                found.AddRange(Extract.From(entry, path, rel));
                files++;
            }
            if (found.Count == 0)
            {
                throw new SetupException($"{entry.Manifest}:{entry.ManifestLine}: no T-SQL text found in {entry.Pattern}"
                    + " (its extraction rule no longer fits the file: update the manifest)");
            }
            texts.AddRange(found);
            if (entry.Schema)
            {
                schemaTexts.AddRange(found);
            }
        }

        var failures = new List<Failure>();
        var parsed = new List<(SqlText Text, TSqlFragment Fragment)>();
        foreach (var text in texts)
        {
            if (list)
            {
                Console.WriteLine($"---- {text.File}:{text.Line} ({text.Where}{(text.Rpc ? ", RPC" : "")})");
                Console.WriteLine(text.Sql);
            }
            var fragment = Check.Parse(text, failures);
            if (fragment is not null)
            {
                parsed.Add((text, fragment));
            }
        }

        var schema = Schema.Procedures(parsed.Where(p => schemaTexts.Contains(p.Text)));
        string schemaFiles = string.Join(", ", entries.Where(e => e.Schema).Select(e => e.Pattern));
        foreach (var (text, fragment) in parsed)
        {
            Check.Calls(text, fragment, schema, schemaFiles, failures);
        }

        foreach (var f in failures)
        {
            Console.WriteLine($"{f.File}:{f.Line}:{f.Where}");
            Console.WriteLine(f.Detail);
        }
        if (expect is not null)
        {
            return Expected.Compare(expect, failures, texts.Count);
        }
        Console.WriteLine($"tsql-check: {texts.Count} T-SQL texts from {files} files ({schema.Count} procedures in the schema),"
            + " parsed by ScriptDom's TSql150Parser (SQL Server 2019)");
        Console.WriteLine($"tsql-check: {texts.Count - failures.Select(f => f.File + ":" + f.Line).Distinct().Count()} passed, "
            + $"{failures.Select(f => f.File + ":" + f.Line).Distinct().Count()} failed");
        return failures.Count == 0 ? 0 : 1;
    }
}

/// <summary>A manifest, its files, or an input that cannot be read: exit 2.</summary>
internal sealed class SetupException(string message) : Exception(message);

/// <summary>
/// sources.txt: one entry a line, "KIND FILES [schema] [statements|procedures] [from: PREFIX]";
/// # starts a comment.  FILES is a path, or a folder and a * pattern in its last part.
/// </summary>
internal static class Manifest
{
    private static readonly string[] Kinds = ["batches", "script", "literals", "c-preprocessed"];

    internal static List<Entry> Read(string path)
    {
        if (!File.Exists(path))
        {
            throw new SetupException($"{path}: no such manifest");
        }
        var entries = new List<Entry>();
        var lines = File.ReadAllLines(path);
        for (int n = 0; n < lines.Length; n++)
        {
            string line = lines[n];
            string? from = null;
            int f = line.IndexOf("from:", StringComparison.Ordinal);
            int hash = line.IndexOf('#', StringComparison.Ordinal);
            if (hash >= 0 && (f < 0 || hash < f))
            {
                line = line[..hash];
                f = -1;
            }
            if (f >= 0)
            {
                from = line[(f + 5)..].Trim();
                line = line[..f];
            }
            var words = line.Split((char[])[' ', '\t'], StringSplitOptions.RemoveEmptyEntries);
            if (words.Length == 0)
            {
                continue;
            }
            if (!Kinds.Contains(words[0]) || words.Length < 2)
            {
                throw new SetupException($"{path}:{n + 1}: expected \"KIND FILES [schema] [statements|procedures] [from: PREFIX]\","
                    + $" KIND one of {string.Join(", ", Kinds)}");
            }
            bool schema = false;
            string take = "statements";
            foreach (var w in words.Skip(2))
            {
                switch (w)
                {
                    case "schema": schema = true; break;
                    case "statements" or "procedures": take = w; break;
                    default: throw new SetupException($"{path}:{n + 1}: unknown word {w}");
                }
            }
            entries.Add(new Entry(words[0], words[1], schema, take, from, path, n + 1));
        }
        return entries;
    }

    internal static List<string> Files(string root, Entry entry)
    {
        string pattern = Path.Combine(root, entry.Pattern);
        string dir = Path.GetDirectoryName(pattern)!;
        string name = Path.GetFileName(pattern);
        if (!name.Contains('*', StringComparison.Ordinal))
        {
            if (!File.Exists(pattern))
            {
                throw new SetupException($"{entry.Manifest}:{entry.ManifestLine}: {entry.Pattern}: no such file");
            }
            return [pattern];
        }
        if (!Directory.Exists(dir))
        {
            throw new SetupException($"{entry.Manifest}:{entry.ManifestLine}: {entry.Pattern}: no such folder");
        }
        var files = Directory.GetFiles(dir, name).OrderBy(p => p, StringComparer.Ordinal).ToList();
        if (files.Count == 0)
        {
            throw new SetupException($"{entry.Manifest}:{entry.ManifestLine}: {entry.Pattern}: no file matches");
        }
        return files;
    }
}

/// <summary>How each kind of entry gives its texts.</summary>
internal static class Extract
{
    // a statement the client sends starts with one of these (upper case, as QueueBox writes T-SQL)
    private static readonly Regex Statement = new(
        @"^\s*(SELECT|EXEC|EXECUTE|DECLARE|SET|IF|BEGIN|COMMIT|ROLLBACK|INSERT|UPDATE|DELETE|WITH|THROW|WHILE|CREATE|ALTER|DROP|TRUNCATE|MERGE)(\s|;|$)",
        RegexOptions.CultureInvariant);

    // a procedure a client calls by name (ADO.NET's CommandType.StoredProcedure, mssql's request.execute)
    private static readonly Regex Procedure = new(@"^queuebox\.[A-Za-z_][A-Za-z0-9_]*$", RegexOptions.CultureInvariant);

    internal static IEnumerable<SqlText> From(Entry entry, string path, string rel)
    {
        string content;
        try
        {
            content = File.ReadAllText(path);
        }
        catch (IOException e)
        {
            throw new SetupException($"{rel}: {e.Message}");
        }
        return entry.Kind switch
        {
            "batches" => Batches(rel, content),
            "script" => [new SqlText(rel, 1, "the file", Markers(content), false)],
            _ => Literals(entry, rel, content),
        };
    }

    /// <summary>
    /// T-SQL batches as the daemon sends them (odbc_migrate.c): a line that is GO ends one;
    /// @SCHEMA_VERSION@ as scripts/embed-schema.sh replaces it.
    /// </summary>
    private static List<SqlText> Batches(string rel, string content)
    {
        var texts = new List<SqlText>();
        var batch = new StringBuilder();
        var lines = content.Replace("@SCHEMA_VERSION@", "0.0.0", StringComparison.Ordinal).Split('\n');
        int start = 1, n = 0;
        void End(int next)
        {
            if (batch.ToString().Trim().Length > 0)
            {
                texts.Add(new SqlText(rel, start, $"batch {texts.Count + 1}", batch.ToString(), false));
            }
            batch.Clear();
            start = next;
        }
        foreach (var raw in lines)
        {
            n++;
            string line = raw.TrimEnd('\r');
            if (line.Trim(' ', '\t').Equals("GO", StringComparison.OrdinalIgnoreCase))
            {
                End(n + 1);
                continue;
            }
            batch.Append(line).Append('\n');
        }
        End(n + 1);
        return texts;
    }

    /// <summary>ODBC's ? parameter markers (outside strings, comments and [names]) as variables, for the parser.</summary>
    internal static string Markers(string sql)
    {
        var b = new StringBuilder(sql.Length + 16);
        int p = 0;
        for (int i = 0; i < sql.Length; i++)
        {
            char c = sql[i];
            if (c == '\'' || c == '[' || c == '"')
            {
                char end = c == '[' ? ']' : c;
                int j = i + 1;
                while (j < sql.Length && !(sql[j] == end && !(j + 1 < sql.Length && sql[j + 1] == end)))
                {
                    j += sql[j] == end ? 2 : 1;
                }
                b.Append(sql, i, Math.Min(j + 1, sql.Length) - i);
                i = j;
            }
            else if (c == '-' && i + 1 < sql.Length && sql[i + 1] == '-')
            {
                int j = sql.IndexOf('\n', i);
                j = j < 0 ? sql.Length : j;
                b.Append(sql, i, j - i);
                i = j - 1;
            }
            else if (c == '/' && i + 1 < sql.Length && sql[i + 1] == '*')
            {
                int j = sql.IndexOf("*/", i + 2, StringComparison.Ordinal);
                j = j < 0 ? sql.Length : j + 2;
                b.Append(sql, i, j - i);
                i = j - 1;
            }
            else if (c == '?')
            {
                b.Append("@odbc_param").Append(++p);
            }
            else
            {
                b.Append(c);
            }
        }
        return b.ToString();
    }

    /// <summary>
    /// The string literals of a C, C#, Go or JavaScript file (a C file preprocessed, its macros
    /// expanded), joined as the language joins them ("a" "b" in C, "a" + "b" elsewhere); of those,
    /// the T-SQL statements or the procedure names, within the lines from: names.
    /// </summary>
    private static List<SqlText> Literals(Entry entry, string rel, string content)
    {
        var lang = Path.GetExtension(rel) switch
        {
            ".i" or ".c" or ".h" => Lang.C,
            ".cs" => Lang.CSharp,
            ".go" => Lang.Go,
            ".js" or ".ts" or ".mjs" => Lang.JavaScript,
            var e => throw new SetupException($"{rel}: literals of {e} files: unknown language"),
        };
        var runs = new Lexer(content, lang, entry.Kind == "c-preprocessed", rel).Runs();
        if (entry.From is not null)
        {
            var (first, last) = Region(entry, rel, runs.Count > 0 ? runs[0].File : rel, content);
            runs = runs.Where(r => r.Line >= first && r.Line <= last).ToList();
        }
        var texts = new List<SqlText>();
        foreach (var run in runs)
        {
            if (entry.Take == "procedures" && Procedure.IsMatch(run.Text))
            {
                texts.Add(new SqlText(run.File, run.Line, $"the procedure {run.Text}, called by name", "EXEC " + run.Text, true));
            }
            else if (entry.Take == "statements" && Statement.IsMatch(run.Text))
            {
                texts.Add(new SqlText(run.File, run.Line, "a statement", Markers(run.Text), false));
            }
        }
        return texts;
    }

    /// <summary>The lines of from: PREFIX: from the first line that starts with it to the next line that is "}".</summary>
    private static (int First, int Last) Region(Entry entry, string rel, string source, string content)
    {
        if (entry.Kind == "c-preprocessed")
        {
            throw new SetupException($"{entry.Manifest}:{entry.ManifestLine}: from: applies to literals, not to c-preprocessed");
        }
        var lines = content.Split('\n');
        int first = Array.FindIndex(lines, l => l.StartsWith(entry.From!, StringComparison.Ordinal));
        if (first < 0)
        {
            throw new SetupException($"{entry.Manifest}:{entry.ManifestLine}: no line of {rel} starts with \"{entry.From}\": update the manifest");
        }
        int last = Array.FindIndex(lines, first + 1, l => l.TrimEnd() == "}");
        return (first + 1, last < 0 ? lines.Length : last + 1);
    }
}

internal enum Lang { C, CSharp, Go, JavaScript }

/// <summary>The string literals of a source file, adjacent ones joined, with where each run starts.</summary>
internal sealed class Lexer(string s, Lang lang, bool markers, string rel)
{
    private static readonly Regex Marker = new(@"^#\s*(\d+)\s+""([^""]*)""", RegexOptions.CultureInvariant);

    private int _i;
    private int _line = 1;          // in the file as read
    private string _file = rel;     // a preprocessed file: the source line markers name
    private int _srcLine = 1;
    private string? _primary;

    internal List<(string File, int Line, string Text)> Runs()
    {
        var runs = new List<(string, int, string)>();
        bool bol = true;
        while (_i < s.Length)
        {
            char c = s[_i];
            if (bol && markers && c == '#')
            {
                LineMarker();
                continue;
            }
            bol = false;
            if (c == '\n')
            {
                Newline();
                bol = true;
            }
            else if (Comment())
            {
            }
            else if (StringStart())
            {
                string file = _file;
                int line = _srcLine;
                var text = new StringBuilder(ReadString());
                while (Joined())
                {
                    text.Append(ReadString());
                }
                if (!markers || file == _primary)
                {
                    runs.Add((file, line, text.ToString()));
                }
                bol = _i > 0 && s[_i - 1] == '\n';
            }
            else if (c == '\'' && lang != Lang.JavaScript)
            {
                // a character (C, C#) or a rune (Go): '\'' too
                _i++;
                while (_i < s.Length && s[_i] != '\'' && s[_i] != '\n')
                {
                    _i += s[_i] == '\\' ? 2 : 1;
                }
                _i++;
            }
            else
            {
                _i++;
            }
        }
        return runs;
    }

    private void Newline()
    {
        _i++;
        _line++;
        _srcLine++;
    }

    // # 103 "src/daemon/backend/sqlserver/odbc_queries.c" 2: the next line is that file's line 103
    private void LineMarker()
    {
        int eol = s.IndexOf('\n', _i);
        string line = s[_i..(eol < 0 ? s.Length : eol)];
        var m = Marker.Match(line);
        if (m.Success)
        {
            _file = m.Groups[2].Value;
            _primary ??= _file;
            _srcLine = int.Parse(m.Groups[1].Value, System.Globalization.CultureInfo.InvariantCulture) - 1;
        }
        _i = eol < 0 ? s.Length : eol;
    }

    private bool Comment()
    {
        if (s[_i] != '/' || _i + 1 >= s.Length)
        {
            return false;
        }
        if (s[_i + 1] == '/')
        {
            while (_i < s.Length && s[_i] != '\n')
            {
                _i++;
            }
            return true;
        }
        if (s[_i + 1] == '*')
        {
            _i += 2;
            while (_i < s.Length && !(s[_i] == '*' && _i + 1 < s.Length && s[_i + 1] == '/'))
            {
                if (s[_i] == '\n')
                {
                    Newline();
                }
                else
                {
                    _i++;
                }
            }
            _i += 2;
            return true;
        }
        return false;
    }

    private bool StringStart()
    {
        char c = s[_i];
        return c == '"'
            || (c == '\'' && lang == Lang.JavaScript)
            || (c == '`' && lang is Lang.Go or Lang.JavaScript)
            || (c == '@' && lang == Lang.CSharp && _i + 1 < s.Length && s[_i + 1] == '"');
    }

    // after a literal: only blanks (and, in C, line markers), then another literal; or, outside C, a + between
    private bool Joined()
    {
        int save = _i, line = _line, src = _srcLine;
        string file = _file;
        bool plus = false;
        while (_i < s.Length)
        {
            char c = s[_i];
            if (c == '\n')
            {
                Newline();
                if (markers && _i < s.Length && s[_i] == '#')
                {
                    LineMarker();
                }
            }
            else if (c is ' ' or '\t' or '\r')
            {
                _i++;
            }
            else if (c == '+' && !plus && lang != Lang.C && !(_i + 1 < s.Length && s[_i + 1] is '+' or '='))
            {
                plus = true;
                _i++;
            }
            else if (Comment())
            {
            }
            else if (StringStart() && (plus || lang == Lang.C))
            {
                return true;
            }
            else
            {
                break;
            }
        }
        _i = save;
        _line = line;
        _srcLine = src;
        _file = file;
        return false;
    }

    private string ReadString()
    {
        var b = new StringBuilder();
        if (s[_i] == '@')
        {
            // C# verbatim: "" is a quote
            _i += 2;
            while (_i < s.Length && !(s[_i] == '"' && !(_i + 1 < s.Length && s[_i + 1] == '"')))
            {
                if (s[_i] == '"')
                {
                    _i++;
                }
                Count(s[_i]);
                b.Append(s[_i++]);
            }
            _i++;
            return b.ToString();
        }
        char q = s[_i++];
        if (q == '`')
        {
            // Go's raw string, JavaScript's template (taken as written)
            while (_i < s.Length && s[_i] != '`')
            {
                Count(s[_i]);
                b.Append(s[_i++]);
            }
            _i++;
            return b.ToString();
        }
        while (_i < s.Length && s[_i] != q && s[_i] != '\n')
        {
            if (s[_i] == '\\' && _i + 1 < s.Length)
            {
                _i++;
                char e = s[_i++];
                switch (e)
                {
                    case 'n': b.Append('\n'); break;
                    case 't': b.Append('\t'); break;
                    case 'r': b.Append('\r'); break;
                    case '0' when !(_i < s.Length && char.IsAsciiDigit(s[_i])): b.Append('\0'); break;
                    case 'x':
                        int h = 0, k = 0;
                        while (k < 2 && _i < s.Length && char.IsAsciiHexDigit(s[_i]))
                        {
                            h = h * 16 + Convert.ToInt32(s[_i++].ToString(), 16);
                            k++;
                        }
                        b.Append((char)h);
                        break;
                    case 'u':
                        b.Append((char)Convert.ToInt32(s.Substring(_i, 4), 16));
                        _i += 4;
                        break;
                    case '\n': Count('\n'); break;  // a C line continuation
                    default: b.Append(e); break;     // \\ \" \' and the rest as themselves
                }
            }
            else
            {
                b.Append(s[_i++]);
            }
        }
        _i++;
        return b.ToString();
    }

    private void Count(char c)
    {
        if (c == '\n')
        {
            _line++;
            _srcLine++;
        }
    }
}

/// <summary>The parse, and the calls of the schema's procedures.</summary>
internal static class Check
{
    internal static TSqlFragment? Parse(SqlText text, List<Failure> failures)
    {
        var parser = new TSql150Parser(initialQuotedIdentifiers: true);
        using var reader = new StringReader(text.Sql);
        var fragment = parser.Parse(reader, out IList<ParseError> errors);
        foreach (var e in errors)
        {
            failures.Add(Fail(text, e.Line, e.Column, $"Msg {e.Number}: {e.Message}"));
        }
        return errors.Count == 0 ? fragment : null;
    }

    internal static void Calls(SqlText text, TSqlFragment fragment, Dictionary<string, Proc> schema, string schemaFiles,
        List<Failure> failures)
    {
        var calls = new Calls();
        fragment.Accept(calls);
        foreach (var (name, reference, line, column) in calls.Found)
        {
            if (!schema.TryGetValue(name, out var proc))
            {
                failures.Add(Fail(text, line, column, $"{name} is not a procedure that the schema ({schemaFiles}) creates"));
                continue;
            }
            int positional = 0;
            foreach (var p in reference.Parameters)
            {
                if (p.Variable is null)
                {
                    positional++;
                }
                else if (!proc.Parameters.Contains(p.Variable.Name.ToLowerInvariant()))
                {
                    failures.Add(Fail(text, p.StartLine, p.StartColumn,
                        $"{name} has no parameter {p.Variable.Name} (it takes {string.Join(", ", proc.Parameters)})"));
                }
            }
            if (reference.Parameters.Count > proc.Parameters.Count)
            {
                failures.Add(Fail(text, line, column,
                    $"{name} takes {proc.Parameters.Count} parameters, {reference.Parameters.Count} given"));
            }
        }
    }

    // where: the file's line (a batch's own line added to its first) and column, or, for a statement
    // taken from a source file's literals, the line it starts on and the place within it; then the
    // statement's line with a caret
    private static Failure Fail(SqlText text, int line, int column, string message)
    {
        var lines = text.Sql.Split('\n');
        string shown = line >= 1 && line <= lines.Length ? lines[line - 1].TrimEnd('\r').Replace('\t', ' ') : "";
        bool whole = text.Where.StartsWith("batch", StringComparison.Ordinal) || text.Where == "the file";
        int fileLine = whole ? text.Line + line - 1 : text.Line;
        string where = whole ? $"{column}: {message} ({text.Where})"
            : $" {message} ({text.Where} on this line; at its line {line}, column {column})";
        var detail = new StringBuilder();
        const int width = 160;
        int from = Math.Max(0, Math.Min(column - 1, shown.Length) - width / 2);
        string cut = shown.Length - from > width ? shown.Substring(from, width) : shown[from..];
        detail.Append("    ").Append(from > 0 ? "..." : "").Append(cut).Append('\n');
        detail.Append("    ").Append(from > 0 ? "   " : "").Append(new string(' ', Math.Max(0, column - 1 - from))).Append('^');
        return new Failure(text.File, fileLine, message, where, detail.ToString());
    }
}

/// <summary>A procedure of the schema and the names of its parameters (lower case, with @).</summary>
internal sealed record Proc(string Name, List<string> Parameters);

/// <summary>The procedures sql/sqlserver's batches create.</summary>
internal static class Schema
{
    internal static Dictionary<string, Proc> Procedures(IEnumerable<(SqlText Text, TSqlFragment Fragment)> batches)
    {
        var procs = new Dictionary<string, Proc>(StringComparer.Ordinal);
        foreach (var (_, fragment) in batches)
        {
            var v = new Definitions();
            fragment.Accept(v);
            foreach (var p in v.Found)
            {
                procs[p.Name] = p;
            }
        }
        return procs;
    }

    internal static string Key(SchemaObjectName n) =>
        $"{n.SchemaIdentifier?.Value ?? "dbo"}.{n.BaseIdentifier.Value}".ToLowerInvariant();

    private sealed class Definitions : TSqlFragmentVisitor
    {
        internal List<Proc> Found { get; } = [];

        public override void Visit(ProcedureStatementBody node)
        {
            if (node is CreateProcedureStatement or CreateOrAlterProcedureStatement or AlterProcedureStatement)
            {
                var name = ((ProcedureStatementBody)node) switch
                {
                    CreateProcedureStatement c => c.ProcedureReference.Name,
                    CreateOrAlterProcedureStatement c => c.ProcedureReference.Name,
                    AlterProcedureStatement a => a.ProcedureReference.Name,
                    _ => null,
                };
                if (name is not null)
                {
                    Found.Add(new Proc(Key(name), node.Parameters.Select(p => p.VariableName.Value.ToLowerInvariant()).ToList()));
                }
            }
            base.Visit(node);
        }
    }
}

/// <summary>Each EXEC of a queuebox.* procedure in a text.</summary>
internal sealed class Calls : TSqlFragmentVisitor
{
    internal List<(string Name, ExecutableProcedureReference Reference, int Line, int Column)> Found { get; } = [];

    public override void Visit(ExecutableProcedureReference node)
    {
        var name = node.ProcedureReference?.ProcedureReference?.Name;
        if (name?.SchemaIdentifier is not null
            && name.SchemaIdentifier.Value.Equals("queuebox", StringComparison.OrdinalIgnoreCase))
        {
            Found.Add((Schema.Key(name), node, node.StartLine, node.StartColumn));
        }
        base.Visit(node);
    }
}

/// <summary>--expect FILE: "PATH:LINE: TEXT" a line, each a failure whose message holds TEXT.</summary>
internal static class Expected
{
    internal static int Compare(string path, List<Failure> failures, int texts)
    {
        var expected = File.ReadAllLines(path)
            .Select((l, n) => (Line: l.Trim(), N: n + 1))
            .Where(l => l.Line.Length > 0 && !l.Line.StartsWith('#'))
            .Select(l =>
            {
                var m = Regex.Match(l.Line, @"^(.+?):(\d+): (.+)$");
                if (!m.Success)
                {
                    throw new SetupException($"{path}:{l.N}: expected PATH:LINE: TEXT");
                }
                return (File: m.Groups[1].Value, Line: int.Parse(m.Groups[2].Value, System.Globalization.CultureInfo.InvariantCulture),
                        Text: m.Groups[3].Value);
            })
            .ToList();
        var left = new List<Failure>(failures);
        int missed = 0;
        foreach (var e in expected)
        {
            var hit = left.FirstOrDefault(f => f.File == e.File && f.Line == e.Line && f.Message.Contains(e.Text, StringComparison.Ordinal));
            if (hit is null)
            {
                Console.WriteLine($"tsql-check: expected and not found: {e.File}:{e.Line}: {e.Text}");
                missed++;
            }
            else
            {
                left.Remove(hit);
            }
        }
        foreach (var f in left)
        {
            Console.WriteLine($"tsql-check: found and not expected: {f.File}:{f.Line}: {f.Message}");
        }
        bool ok = missed == 0 && left.Count == 0;
        Console.WriteLine($"tsql-check: its own test: {texts} texts, {failures.Count} failures, "
            + (ok ? "each one expected" : $"{missed} expected ones missing, {left.Count} unexpected"));
        return ok ? 0 : 1;
    }
}
