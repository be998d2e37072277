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

/** A pg client in the handler's open transaction: write through it, never commit or roll back. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

export interface InboxDialect {
  readonly dialect: string;
}

/** The PostgreSQL dialect over a pg.Pool. */
export function fromPg(pool: unknown): InboxDialect;

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
}

export interface InboxCounters {
  claimed: number;
  completed: number;
  retried: number;
  dead: number;
  leaseLost: number;
}

export type InboxHandler<P = unknown> =
  (message: InboxMessage<P>, tx: Queryable, signal: AbortSignal) => Promise<void>;

export class InboxWorker<P = unknown> {
  constructor(db: InboxDialect, options: InboxWorkerOptions);
  readonly counters: InboxCounters;
  /** Claims and handles messages until signal aborts; resolves when every running handler ended. */
  run(handler: InboxHandler<P>, signal?: AbortSignal): Promise<void>;
}
