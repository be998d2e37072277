// Types of @alternayte/queuebox-inbox (src/index.js has the contract).

export interface InboxMessage<P = unknown> {
  /** the inbox row's id (a bigint, as text) */
  id: string;
  claimToken: string;
  source: string;
  idempotencyKey: string;
  eventType: string | null;
  aggregateId: string | null;
  /** the payload, parsed JSON */
  payload: P;
  headers: Record<string, unknown>;
  /** attempts made before this one */
  attempt: number;
  createdAt: Date;
  /** the payload as a typed value, checked by a function of yours */
  json<T = P>(check?: (payload: unknown) => T): T;
}

export interface RetryDecision {
  dead: boolean;
  delayMs: number;
}

export type InboxRetryPolicy = (message: InboxMessage, error: unknown) => RetryDecision;

export function retryAfter(ms: number): RetryDecision;
export function deadLetter(): RetryDecision;
export function defaultRetryPolicy(message: InboxMessage): RetryDecision;

export class LeaseLostError extends Error {}

/** A dialect's claim could not run this time and will later (SQL Server: Msg 51000); the worker claims again. */
export class ClaimBusyError extends Error {
  readonly temporary: true;
  /** what the driver threw */
  readonly cause: unknown;
}

/** Whether an error (an mssql RequestError, or what it wraps) is SQL Server's Msg 51000, the claim's lock timeout. */
export function isClaimLockTimeout(error: unknown): boolean;

/** The shortest request timeout fromMssql accepts (ms): 30000. */
export const MSSQL_MIN_REQUEST_TIMEOUT: number;

/** A pg client in the handler's open transaction: write through it, never commit or roll back. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

/**
 * The handler's open transaction on SQL Server: an mssql Transaction. Write through
 * new sql.Request(tx) or tx.request(); never commit or roll it back.
 * (Structural, so that these types need no @types/mssql.)
 */
export interface MssqlTransaction {
  request(): MssqlRequest;
  begin(isolationLevel?: number): Promise<unknown>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}

export interface MssqlRequest {
  input(name: string, type: unknown, value?: unknown): MssqlRequest;
  input(name: string, value: unknown): MssqlRequest;
  query(text: string): Promise<{ recordset: any[]; recordsets: any[][]; rowsAffected: number[] }>;
  execute(procedure: string): Promise<{ recordset: any[]; recordsets: any[][]; rowsAffected: number[] }>;
}

/** What fromMssql reads of an mssql ConnectionPool. */
export interface MssqlPoolLike {
  readonly config: { requestTimeout?: number; options?: { useUTC?: boolean } };
  request(): MssqlRequest;
  transaction(): MssqlTransaction;
}

/** A dialect: the five statements of one database; Tx is what the handler writes through. */
export interface InboxDialect<Tx = Queryable> {
  readonly dialect: string;
  /** never called by the application: a type marker for Tx */
  readonly __tx?: Tx;
}

/** The PostgreSQL dialect over a pg.Pool. */
export function fromPg(pool: unknown): InboxDialect<Queryable>;

/**
 * The SQL Server dialect over a connected mssql ConnectionPool. Throws a RangeError
 * when pool.config.requestTimeout is under 30000 ms (unset: mssql's 15000), saying what to set.
 */
export function fromMssql(pool: MssqlPoolLike): InboxDialect<MssqlTransaction>;

export interface InboxLogger {
  debug?(message: string): void;
  info?(message: string): void;
  warn?(message: string): void;
  error?(message: string): void;
}

export interface InboxWorkerOptions {
  source: string;
  batchSize?: number;
  leaseMs?: number;
  maxConcurrency?: number;
  shutdownGraceMs?: number;
  idleMs?: number;
  retryPolicy?: InboxRetryPolicy;
  logger?: InboxLogger;
  /**
   * An OpenTelemetry Tracer (`trace.getTracer(...)` of @opentelemetry/api): each handler
   * runs in a span "queuebox.inbox process" (kind CONSUMER), the child of the message's
   * traceparent when it has one.
   */
  tracer?: { startActiveSpan: (...args: any[]) => any };
}

/** The W3C trace context a message arrived with, or null (docs/observability.md). */
export interface InboxTraceContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: string;
}
export function traceContextOf(message: InboxMessage<unknown>): InboxTraceContext | null;

export interface InboxCounters {
  claimed: number;
  completed: number;
  retried: number;
  dead: number;
  leaseLost: number;
}

export type InboxHandler<P = unknown, Tx = Queryable> =
  (message: InboxMessage<P>, tx: Tx, signal: AbortSignal) => Promise<void>;

export class InboxWorker<P = unknown, Tx = Queryable> {
  constructor(db: InboxDialect<Tx>, options: InboxWorkerOptions);
  readonly counters: InboxCounters;
  /** Claims and handles messages until signal aborts; resolves when every running handler ended. */
  run(handler: InboxHandler<P, Tx>, signal?: AbortSignal): Promise<void>;
}

// ---- the outbox (src/outbox.js, docs/enqueue.md)

/** One row of queuebox.outbox. */
export interface OutboxMessage<P = unknown> {
  /** routed by the configuration's routes; a topic no route matches goes dead at its claim */
  topic: string;
  /** the ordering key: rows of one key are delivered one at a time, in id order; null: none */
  key?: string | null;
  /** any JSON value (JSON.stringify) */
  payload: P;
  /** string values; a traceparent set here wins over the active span's */
  headers?: Record<string, string>;
  /** not delivered before this time (default: now) */
  scheduledAt?: Date | null;
  /** delivery attempts before the row goes dead (default: the configuration's outbox.maxAttempts) */
  maxAttempts?: number | null;
}

/**
 * A pg client (pg's ClientBase: a Client, or a PoolClient from pool.connect())
 * after BEGIN. Not a pg.Pool: it would run the INSERT on a connection of its own
 * and commit it apart from your writes (enqueue throws a TypeError).
 * (Structural, so that these types need no @types/pg.)
 */
export interface OutboxPgClient {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
  /** a pg.Pool's; a client has none */
  totalCount?: never;
}

/** A pg client after BEGIN, or a begun mssql Transaction. */
export type OutboxTransaction = OutboxPgClient | MssqlTransaction;

/** Writes the messages in the transaction, in one round trip (on SQL Server one per 300); resolves to their ids (bigint as text), in order. */
export function enqueueBatch(tx: OutboxTransaction, messages: OutboxMessage[]): Promise<string[]>;
/** One message; resolves to its id (bigint as text). */
export function enqueue(tx: OutboxTransaction, message: OutboxMessage): Promise<string>;
/** The active span's (@opentelemetry/api) traceparent and tracestate, or null. */
export function currentTraceHeaders(): { traceparent: string; tracestate?: string } | null;
/** Whether text is a traceparent the W3C spec lets a receiver use. */
export function isTraceparent(text: string): boolean;
export const TRACEPARENT_FORMAT: string;
