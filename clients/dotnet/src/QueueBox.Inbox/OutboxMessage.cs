// OutboxMessage: one row for queuebox.outbox, made in the application's
// code: the topic, the payload as JSON text (System.Text.Json), the ordering
// key, the headers with the trace context of the code that made it, and
// the time before which it is not delivered.
//
// The trace rule (docs/observability.md): a traceparent header the caller
// gives is kept, checked against W3C Trace Context; without one, the
// current Activity's context is taken when the message is made, so the
// delivery's span is a child of the code that enqueued it.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text.Json;

namespace QueueBox.Inbox;

/// <summary>A message for the QueueBox outbox: written by <see cref="OutboxTransactionExtensions.EnqueueAsync{TPayload}"/>
/// or <see cref="OutboxTransactionExtensions.EnqueueBatchAsync"/> in the application's transaction.</summary>
public sealed class OutboxMessage
{
    /// <summary>The serializer options a payload is written with when none are given: System.Text.Json's web
    /// defaults (property names in camelCase).</summary>
    public static readonly JsonSerializerOptions DefaultJsonOptions = new(JsonSerializerDefaults.Web);

    private OutboxMessage(string topic, string payload, string? key, IReadOnlyDictionary<string, string> headers,
        DateTimeOffset? notBefore)
    {
        Topic = topic;
        Payload = payload;
        Key = key;
        Headers = headers;
        NotBefore = notBefore;
    }

    /// <summary>The row's <c>message_id</c>, made here (the <c>X-Message-Id</c> a destination gets).</summary>
    public Guid MessageId { get; } = Guid.NewGuid();

    /// <summary>The topic the routes match.</summary>
    public string Topic { get; }

    /// <summary>The payload, as JSON text.</summary>
    public string Payload { get; }

    /// <summary>The ordering key: rows of one key are delivered one at a time in insert order. Null: no order.</summary>
    public string? Key { get; }

    /// <summary>The headers stored with the row, <c>traceparent</c> and <c>tracestate</c> among them when
    /// the caller gave them or an activity was current.</summary>
    public IReadOnlyDictionary<string, string> Headers { get; }

    /// <summary>Not delivered before this time (the row's <c>scheduled_at</c>); null: at once.</summary>
    public DateTimeOffset? NotBefore { get; }

    /// <summary>Delivery attempts before the row goes dead; null takes <c>outbox.maxAttempts</c>.</summary>
    public int? MaxAttempts { get; init; }

    /// <summary>A message whose payload is <paramref name="payload"/> serialized by System.Text.Json.</summary>
    /// <typeparam name="TPayload">The payload's type.</typeparam>
    /// <param name="topic">The topic (not empty).</param>
    /// <param name="payload">The payload; a <see cref="JsonElement"/> or a JsonNode is written as it is.</param>
    /// <param name="key">The ordering key, or null.</param>
    /// <param name="headers">Headers to store with the row. A <c>traceparent</c> here (any letter case) is
    /// kept, with its <c>tracestate</c>; without one the current <see cref="Activity"/>'s are added.</param>
    /// <param name="notBefore">Not delivered before this time, or null.</param>
    /// <param name="jsonOptions">The serializer's options (default: <see cref="DefaultJsonOptions"/>).</param>
    /// <returns>The message.</returns>
    /// <exception cref="ArgumentException">The topic is empty, or the <c>traceparent</c> given is not a
    /// W3C traceparent (the message names it and the format).</exception>
    public static OutboxMessage Create<TPayload>(string topic, TPayload payload, string? key = null,
        IReadOnlyDictionary<string, string>? headers = null, DateTimeOffset? notBefore = null,
        JsonSerializerOptions? jsonOptions = null)
    {
        ArgumentException.ThrowIfNullOrEmpty(topic);
        var json = JsonSerializer.Serialize(payload, jsonOptions ?? DefaultJsonOptions);
        return new OutboxMessage(topic, json, key, OutboxTraceContext.Headers(headers, Activity.Current), notBefore);
    }
}
