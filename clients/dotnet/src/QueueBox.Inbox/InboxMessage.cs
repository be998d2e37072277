// InboxMessage: one claimed inbox message of a pull source, as the handler
// and the retry policy see it.
using System;
using System.Collections.Generic;
using System.Text.Json;

namespace QueueBox.Inbox;

/// <summary>One claimed inbox message of a pull source.</summary>
public sealed class InboxMessage
{
    internal InboxMessage(long id, Guid claimToken, string source, string idempotencyKey, string? eventType,
        string? aggregateId, JsonElement payload, IReadOnlyDictionary<string, string> headers, int attempt,
        DateTimeOffset createdAt)
    {
        Id = id;
        ClaimToken = claimToken;
        Source = source;
        IdempotencyKey = idempotencyKey;
        EventType = eventType;
        AggregateId = aggregateId;
        Payload = payload;
        Headers = headers;
        Attempt = attempt;
        CreatedAt = createdAt;
    }

    /// <summary>The inbox row's id.</summary>
    public long Id { get; }

    /// <summary>The pull source the message arrived on.</summary>
    public string Source { get; }

    /// <summary>Identifies the message within its source: make a handler idempotent on
    /// (<see cref="Source"/>, <see cref="IdempotencyKey"/>).</summary>
    public string IdempotencyKey { get; }

    /// <summary>The event type, or null when the message has none.</summary>
    public string? EventType { get; }

    /// <summary>The unit of order, or null when the message has none.</summary>
    public string? AggregateId { get; }

    /// <summary>The message's JSON document.</summary>
    public JsonElement Payload { get; }

    /// <summary>The received headers (a value that is not a JSON string is kept as its JSON text).</summary>
    public IReadOnlyDictionary<string, string> Headers { get; }

    /// <summary>The attempts made before this one (0 the first time).</summary>
    public int Attempt { get; }

    /// <summary>When the message was stored.</summary>
    public DateTimeOffset CreatedAt { get; }

    /// <summary>The claim's token: the renewal, completion, retry and dead letter bind it.</summary>
    internal Guid ClaimToken { get; }

    /// <summary>Parses a payload column (JSON text) into a detached element.</summary>
    internal static JsonElement ParsePayload(string text)
    {
        using var document = JsonDocument.Parse(text);
        return document.RootElement.Clone();
    }

    /// <summary>Reads the headers column, a JSON object, or null.</summary>
    internal static IReadOnlyDictionary<string, string> ParseHeaders(string? text)
    {
        var headers = new Dictionary<string, string>(StringComparer.Ordinal);
        if (string.IsNullOrEmpty(text))
        {
            return headers;
        }
        using var document = JsonDocument.Parse(text);
        if (document.RootElement.ValueKind != JsonValueKind.Object)
        {
            return headers;
        }
        foreach (var field in document.RootElement.EnumerateObject())
        {
            headers[field.Name] = field.Value.ValueKind == JsonValueKind.String
                ? field.Value.GetString()!
                : field.Value.GetRawText();
        }
        return headers;
    }
}
