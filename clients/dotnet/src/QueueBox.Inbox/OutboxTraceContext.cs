// OutboxTraceContext: the trace headers of a new outbox row.  A caller's
// traceparent wins and is checked here, where the caller can be told (the
// relay would otherwise drop a malformed one silently at delivery), and
// keeps the caller's tracestate beside it.  Without one, the caller's
// tracestate (any letter case) is dropped: it belongs to no traceparent of
// the row (W3C: a tracestate without its traceparent is discarded), and
// beside the Activity's traceparent it would describe another trace; the
// Activity's traceparent and tracestate go together instead.
using System;
using System.Collections.Generic;
using System.Diagnostics;

namespace QueueBox.Inbox;

internal static class OutboxTraceContext
{
    internal const string Format =
        "00-<trace-id: 32 lowercase hex>-<parent-id: 16 lowercase hex>-<flags: 2 lowercase hex>, the ids not all zeros (W3C Trace Context)";

    /// <summary>The headers to store: the caller's; when they carry no traceparent, without their tracestate
    /// and with the current activity's traceparent and tracestate.</summary>
    internal static IReadOnlyDictionary<string, string> Headers(IReadOnlyDictionary<string, string>? headers, Activity? current)
    {
        var result = new Dictionary<string, string>(StringComparer.Ordinal);
        string? traceparent = null;
        foreach (var (name, value) in headers ?? new Dictionary<string, string>())
        {
            ArgumentNullException.ThrowIfNull(value, $"headers[\"{name}\"]");
            if (string.Equals(name, "traceparent", StringComparison.OrdinalIgnoreCase))
            {
                traceparent = value;
            }
            result[name] = value;
        }
        if (traceparent is not null)
        {
            if (!Valid(traceparent))
            {
                throw new ArgumentException(
                    $"the traceparent header \"{traceparent}\" is not a W3C traceparent: the format is {Format}", nameof(headers));
            }
        }
        else
        {
            DropTracestate(result);
            if (current is null || current.IdFormat != ActivityIdFormat.W3C)
            {
                return result;
            }
            result["traceparent"] = string.Concat("00-", current.TraceId.ToHexString(), "-",
                current.SpanId.ToHexString(), (current.ActivityTraceFlags & ActivityTraceFlags.Recorded) != 0 ? "-01" : "-00");
            if (!string.IsNullOrEmpty(current.TraceStateString))
            {
                result["tracestate"] = current.TraceStateString;
            }
        }
        return result;
    }

    /// <summary>Removes every tracestate header, whatever its letter case.</summary>
    private static void DropTracestate(Dictionary<string, string> headers)
    {
        foreach (var name in System.Linq.Enumerable.ToList(headers.Keys))
        {
            if (string.Equals(name, "tracestate", StringComparison.OrdinalIgnoreCase))
            {
                headers.Remove(name);
            }
        }
    }

    /// <summary>Whether <paramref name="v"/> is a traceparent QueueBox sends on (version 00, or a later
    /// version's first four fields): the rule of docs/observability.md.</summary>
    private static bool Valid(string v)
    {
        if (v.Length < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' || !Hex(v, 0, 2) || !Hex(v, 3, 32)
            || !Hex(v, 36, 16) || !Hex(v, 53, 2) || v.StartsWith("ff", StringComparison.Ordinal))
        {
            return false;
        }
        if (v.StartsWith("00", StringComparison.Ordinal) ? v.Length != 55 : v.Length > 55 && v[55] != '-')
        {
            return false;
        }
        return !AllZero(v, 3, 32) && !AllZero(v, 36, 16);
    }

    private static bool Hex(string s, int start, int length)
    {
        for (var i = start; i < start + length; i++)
        {
            if (!char.IsAsciiHexDigitLower(s[i]))
            {
                return false;
            }
        }
        return true;
    }

    private static bool AllZero(string s, int start, int length)
    {
        for (var i = start; i < start + length; i++)
        {
            if (s[i] != '0')
            {
                return false;
            }
        }
        return true;
    }
}
