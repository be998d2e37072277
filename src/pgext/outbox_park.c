/*-------------------------------------------------------------------------
 * outbox_park.c
 *	  Parked at insert: a new keyed row whose key has an earlier open row
 *	  is inserted parked (hold 'key'), so no claim ever reads it
 *	  (docs/design/claim.md, "Parked at insert").
 *
 * Wording:
 *	- open: pending or processing, or dead and holding its key (hold
 *	  'dead'): the predicate of outbox_key_open_idx.
 *	- a blocker of a row: an earlier (lower id) open row of its key, as of
 *	  now (SnapshotSelf: every committed row, and this transaction's own,
 *	  the rows of the running statement included).  The probe finds the
 *	  nearest one with one backward scan of outbox_key_open_idx.
 *	- the seen rows: for each key, where this backend last found a
 *	  blocker.  A new row of the key looks there first and takes that row
 *	  when it is still an open row of the key (the same test as the probe's,
 *	  on the row itself): a busy key's backlog is not read again at every
 *	  insert (the probe reads every entry of the key on its index page).
 *	  Only a hint: whatever it points at is checked.
 *	- a parked key: a key of which this transaction parked a row at insert;
 *	  its first parked row (the lowest id), and that row's blocker: where
 *	  it is, and whether it is a row of this transaction.
 *
 * Why a park made here is never lost.  The blocker's end promotes its
 * key's first open row (QB_PG_OUTBOX_PROMOTE, a statement after the settle),
 * but a promotion cannot see a row whose transaction has not committed.
 * So at PRE_COMMIT, for each parked key whose blocker is not this
 * transaction's own row, a blocker is locked FOR SHARE without waiting, as
 * the claim locks the row it parks behind: the one found at insert when it
 * is still open, else the nearest found again:
 *	- locked: the blocker's end (an UPDATE) waits for this commit, and the
 *	  promotion after it sees the park.  Any earlier open row will do, not
 *	  only the nearest: a key's rows end in id order (a claim takes only
 *	  the first open row of its key), so the rows between the blocker and
 *	  the park end after it, and the last of them promotes the park;
 *	- gone (ended since), or locked by a settle right now: the first parked
 *	  row is released (hold NULL, 'ready' when unrouted), and the claim that
 *	  meets it checks its order again, parking it under its own lock if
 *	  need be.  The rows parked behind it stay parked: it is open.
 * A blocker of this transaction commits with the park, and ends later.
 * The share locks last from PRE_COMMIT to the end of the commit; nothing
 * here waits on a lock.  PREPARE TRANSACTION releases instead of locking:
 * its locks would hold the blockers' settles until COMMIT PREPARED.  A
 * rolled-back subtransaction forgets the keys it parked first (their rows
 * are gone; a later park of the key in this transaction records it again).
 *
 * Memory: the parked keys live in TopTransactionContext; qb_park_forget()
 * drops them at every end of the transaction.  The first key a transaction
 * parks is kept in a static entry (qbop_first), the table is made only for
 * a second key: most transactions park one row, and a hash table with its
 * memory context per transaction was about 8 % of the row trigger's time
 * (perf: hash_create 0.25 % of the inserting backends' samples, the row
 * trigger 3.25 %; bench/RESULTS.md, "Issue 37, target 3").  The seen rows live in
 * their own context for the backend's life, at most QBP_SEEN_MAX keys (then
 * they start again), forgotten when the outbox is another table.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type_d.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "storage/bufmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "qb_pg.h"

#define QBP_KEY_INDEX	"outbox_key_open_idx"
/* the seen rows kept, at most (a few hundred kB) */
#define QBP_SEEN_MAX	4096

typedef struct QbpKey
{
	char	   *key;			/* hash key: the unit (qbop_unit), a copy in
								 * TopTransactionContext */
	char	   *rowkey;			/* the key's text, in TopTransactionContext */
	char	   *dest;			/* its destination, NULL: not routed */
	int64		first_id;		/* the lowest id parked */
	bool		own_blocker;	/* first_id's blocker is this transaction's */
	ItemPointerData blocker;	/* where first_id's blocker was found */
	SubTransactionId subid;		/* the subtransaction that recorded it */
} QbpKey;

typedef struct QbpSeen
{
	char	   *key;			/* hash key: the unit, a copy in qbop_seen_cxt */
	ItemPointerData tid;		/* where a blocker of the unit was found */
} QbpSeen;

/*
 * qbop_unit: a key and destination as one string, "<length of dest>:<dest>
 * <key>" (dest "" when not routed), for the tables: two units never spell
 * the same.  Palloc'd in the current context.
 */
static char *
qbop_unit(const char *key, const char *dest)
{
	return psprintf("%d:%s%s", dest ? (int) strlen(dest) : -1, dest ? dest : "", key);
}

static QbpKey qbop_first;		/* the transaction's first parked key */
static bool qbop_have_first = false;
static HTAB *qbop_keys = NULL;	/* the others, when there are */
static Oid	qbop_outbox = InvalidOid;	/* the table the trigger ran on */
static QbParkAtts qbop_atts;	/* its columns, as the trigger found them */

static HTAB *qbop_seen = NULL;
static MemoryContext qbop_seen_cxt = NULL;
static Oid	qbop_seen_outbox = InvalidOid;	/* the table they are rows of */

static uint32
qbop_hash(const void *key, Size keysize)
{
	const char *k = *(const char *const *) key;

	return hash_bytes((const unsigned char *) k, (int) strlen(k));
}

static int
qbop_match(const void *a, const void *b, Size keysize)
{
	return strcmp(*(const char *const *) a, *(const char *const *) b);
}

static void *
qbop_keycopy(void *dest, const void *src, Size keysize)
{
	*(char **) dest = MemoryContextStrdup(TopTransactionContext, *(const char *const *) src);
	return dest;
}

static void *
qbop_seen_keycopy(void *dest, const void *src, Size keysize)
{
	*(char **) dest = MemoryContextStrdup(qbop_seen_cxt, *(const char *const *) src);
	return dest;
}

/* qbop_table: a hash of char * keys in cxt, their copies made by keycopy */
static HTAB *
qbop_table(const char *name, Size entrysize, MemoryContext cxt, HashCopyFunc keycopy)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(char *);
	ctl.entrysize = entrysize;
	ctl.hash = qbop_hash;
	ctl.match = qbop_match;
	ctl.keycopy = keycopy;
	ctl.hcxt = cxt;
	return hash_create(name, 64, &ctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_KEYCOPY | HASH_CONTEXT);
}

/* qbop_text_is: the text Datum d is the string s. */
static bool
qbop_text_is(Datum d, const char *s)
{
	text	   *t = DatumGetTextPP(d);

	return VARSIZE_ANY_EXHDR(t) == strlen(s) && memcmp(VARDATA_ANY(t), s, strlen(s)) == 0;
}

/*
 * qbop_check: the row version at tid is a blocker of a row (id, key, dest),
 * as the probe would find it: visible as of now (SnapshotSelf), of the key,
 * at dest or not routed (any destination when dest is NULL), below id, and
 * open.  It stays in slot, whose pin keeps it from being
 * pruned away before the caller locks it.  *own says this transaction
 * inserted it.  The caller makes sure tid's block exists.
 */
static bool
qbop_check(Relation heap, ItemPointer tid, Datum key, const char *dest, int64 id,
		   TupleTableSlot *slot, bool *own)
{
	bool		isnull;
	Datum		d;
	bool		should_free;
	HeapTuple	t;

	if (!table_tuple_fetch_row_version(heap, tid, SnapshotSelf, slot))
		return false;
	d = slot_getattr(slot, qbop_atts.id, &isnull);
	if (isnull || DatumGetInt64(d) >= id)
		return false;
	d = slot_getattr(slot, qbop_atts.key, &isnull);
	if (isnull || !datum_image_eq(d, key, false, -1))
		return false;
	d = slot_getattr(slot, qbop_atts.destination, &isnull);
	if (dest != NULL && !isnull && !qbop_text_is(d, dest))
		return false;
	d = slot_getattr(slot, qbop_atts.state, &isnull);
	if (isnull || !(qbop_text_is(d, "pending") || qbop_text_is(d, "processing")))
	{
		d = slot_getattr(slot, qbop_atts.hold, &isnull);
		if (isnull || !qbop_text_is(d, "dead"))
			return false;
	}
	t = ExecFetchSlotHeapTuple(slot, false, &should_free);
	*own = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(t->t_data));
	if (should_free)
		heap_freetuple(t);
	return true;
}

/*
 * qbop_scan: the first row version a backward scan of idx finds with sk
 * (nkeys of them), as of now; *own says this transaction inserted it, *tid
 * where it is, and it stays in slot.
 */
static bool
qbop_scan(Relation heap, Relation idx, ScanKey sk, int nkeys, bool *own, ItemPointer tid,
		  TupleTableSlot *slot)
{
	IndexScanDesc scan = qb_index_beginscan(heap, idx, SnapshotSelf, nkeys, 0);
	bool		found;

	index_rescan(scan, sk, nkeys, NULL, 0);
	found = index_getnext_slot(scan, BackwardScanDirection, slot);
	if (found)
	{
		bool		should_free;
		HeapTuple	t = ExecFetchSlotHeapTuple(slot, false, &should_free);

		*own = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(t->t_data));
		*tid = slot->tts_tid;
		if (should_free)
			heap_freetuple(t);
	}
	index_endscan(scan);
	return found;
}

/*
 * qbop_blocker: an open row of key (a text Datum) placed below id that
 * holds back a row at dest (NULL: not routed), as of now: at dest, then
 * among the rows not routed yet (outbox_key_open_idx is (key,
 * coalesce(destination, ''), coalesce(origin, id))); of a row not routed
 * yet, at any destination.  *own says this transaction inserted it, *tid
 * where it is; it stays in keep when given (pinned, for a lock).  False
 * when there is none, or when the index is missing (a schema before 0.2.0:
 * nothing is parked at insert then).
 */
static bool
qbop_blocker(Relation heap, Datum key, const char *dest, int64 id, bool *own, ItemPointer tid,
			 TupleTableSlot *keep)
{
	Oid			idxoid = get_relname_relid(QBP_KEY_INDEX, RelationGetNamespace(heap));
	Relation	idx;
	ScanKeyData sk[3];
	TupleTableSlot *slot;
	bool		found;

	if (!OidIsValid(idxoid))
		return false;
	idx = index_open(idxoid, AccessShareLock);
	slot = keep != NULL ? keep : table_slot_create(heap, NULL);
	ScanKeyEntryInitialize(&sk[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, key);
	ScanKeyEntryInitialize(&sk[2], 0, 3, BTLessStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8LT, Int64GetDatum(id));
	if (IndexRelationGetNumberOfKeyAttributes(idx) == 2)
	{
		/* (key, id): a schema before 0.3.8, not updated yet; one order per key */
		ScanKeyEntryInitialize(&sk[1], 0, 2, BTLessStrategyNumber, InvalidOid,
							   InvalidOid, F_INT8LT, Int64GetDatum(id));
		found = qbop_scan(heap, idx, sk, 2, own, tid, slot);
	}
	else if (dest == NULL)
	{
		sk[1] = sk[2];
		found = qbop_scan(heap, idx, sk, 2, own, tid, slot);
	}
	else
	{
		ScanKeyEntryInitialize(&sk[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
							   idx->rd_indcollation[1], F_TEXTEQ, CStringGetTextDatum(dest));
		found = qbop_scan(heap, idx, sk, 3, own, tid, slot);
		if (!found)
		{
			ScanKeyEntryInitialize(&sk[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
								   idx->rd_indcollation[1], F_TEXTEQ, CStringGetTextDatum(""));
			found = qbop_scan(heap, idx, sk, 3, own, tid, slot);
		}
	}
	if (keep == NULL)
		ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	return found;
}

/*
 * qbop_seen_blocker: the key's seen row, when it is still a blocker of the
 * row (id, key) of heap; *tid where it is.
 */
static bool
qbop_seen_blocker(Relation heap, const char *k, Datum key, const char *dest, int64 id,
				  bool *own, ItemPointer tid)
{
	QbpSeen    *s;
	TupleTableSlot *slot;
	bool		found;

	if (qbop_seen == NULL || qbop_seen_outbox != RelationGetRelid(heap))
		return false;
	s = hash_search(qbop_seen, &k, HASH_FIND, NULL);
	/* a VACUUM may have cut the table short since (not while we insert) */
	if (s == NULL || ItemPointerGetBlockNumber(&s->tid) >= RelationGetNumberOfBlocks(heap))
		return false;
	slot = table_slot_create(heap, NULL);
	found = qbop_check(heap, &s->tid, key, dest, id, slot, own);
	ExecDropSingleTupleTableSlot(slot);
	if (found)
		*tid = s->tid;
	return found;
}

/* qbop_see: the key's blocker is at tid now (NULL: it has none). */
static void
qbop_see(Relation heap, const char *k, ItemPointer tid)
{
	QbpSeen    *s;

	if (qbop_seen_cxt == NULL)
		qbop_seen_cxt = AllocSetContextCreate(TopMemoryContext, "queuebox seen keys",
											  ALLOCSET_DEFAULT_SIZES);
	if (qbop_seen != NULL && (qbop_seen_outbox != RelationGetRelid(heap) ||
							  (tid != NULL && hash_get_num_entries(qbop_seen) >= QBP_SEEN_MAX)))
	{
		MemoryContextReset(qbop_seen_cxt);	/* the table went with it */
		qbop_seen = NULL;
	}
	if (tid == NULL)
	{
		if (qbop_seen != NULL)
			(void) hash_search(qbop_seen, &k, HASH_REMOVE, NULL);
		return;
	}
	if (qbop_seen == NULL)
	{
		qbop_seen = qbop_table("queuebox seen keys", sizeof(QbpSeen), qbop_seen_cxt,
							   qbop_seen_keycopy);
		qbop_seen_outbox = RelationGetRelid(heap);
	}
	s = hash_search(qbop_seen, &k, HASH_ENTER, NULL);
	s->tid = *tid;
}

/*
 * qbop_key_entry: the transaction's entry of parked key k, made when it
 * has none (*found false): the static first entry while it is free and k
 * is in no table, else one of the table.
 */
static QbpKey *
qbop_key_entry(const char *k, bool *found)
{
	QbpKey	   *e;

	if (qbop_have_first && strcmp(qbop_first.key, k) == 0)
	{
		*found = true;
		return &qbop_first;
	}
	if (qbop_keys == NULL && !qbop_have_first)
	{
		memset(&qbop_first, 0, sizeof(qbop_first));
		qbop_first.key = MemoryContextStrdup(TopTransactionContext, k);
		qbop_have_first = true;
		*found = false;
		return &qbop_first;
	}
	if (qbop_keys == NULL)
		qbop_keys = qbop_table("queuebox parked keys", sizeof(QbpKey), TopTransactionContext,
							   qbop_keycopy);
	e = hash_search(qbop_keys, &k, HASH_ENTER, found);
	if (!*found)
		e->rowkey = e->dest = NULL;
	return e;
}

/*
 * qb_park_at_insert: the outbox_route trigger's question for a new keyed
 * row (id, key) of heap routed to dest (NULL: not routed), whose columns
 * are atts: does an earlier row of its key keep it waiting?  True: the
 * caller inserts it parked, and the key and destination are recorded for
 * PRE_COMMIT.
 */
bool
qb_park_at_insert(Relation heap, const QbParkAtts *atts, int64 id, Datum key, const char *dest)
{
	bool		own = false;
	ItemPointerData tid;
	char	   *rowkey = TextDatumGetCString(key);
	char	   *k = qbop_unit(rowkey, dest);
	QbpKey	   *e;
	bool		found;

	qbop_atts = *atts;
	if (!qbop_seen_blocker(heap, k, key, dest, id, &own, &tid))
	{
		found = qbop_blocker(heap, key, dest, id, &own, &tid, NULL);
		qbop_see(heap, k, found ? &tid : NULL);
		if (!found)
		{
			pfree(k);
			pfree(rowkey);
			return false;
		}
	}
	qbop_outbox = RelationGetRelid(heap);
	e = qbop_key_entry(k, &found);
	if (e->rowkey == NULL)
	{
		e->rowkey = MemoryContextStrdup(TopTransactionContext, rowkey);
		e->dest = dest ? MemoryContextStrdup(TopTransactionContext, dest) : NULL;
	}
	if (!found || id < e->first_id)
	{
		e->first_id = id;
		e->own_blocker = own;
		e->blocker = tid;
		e->subid = GetCurrentSubTransactionId();
	}
	pfree(k);
	pfree(rowkey);
	return true;
}

/*
 * qbop_lock: lock the row version at tid FOR SHARE, without waiting.  The
 * version itself, not a later one (no TUPLE_LOCK_FLAG_FIND_LAST_VERSION),
 * so the snapshot is only read to follow an update chain, which this never
 * asks: SnapshotSelf, not a GetLatestSnapshot() per commit.
 */
static bool
qbop_lock(Relation heap, ItemPointer tid, TupleTableSlot *slot)
{
	TM_FailureData tmfd;

	return table_tuple_lock(heap, tid, SnapshotSelf, slot, GetCurrentCommandId(true),
							LockTupleShare, LockWaitSkip, 0, &tmfd) == TM_Ok;
}

/*
 * qbop_held: at PRE_COMMIT, e's first parked row keeps its place: its
 * blocker is this transaction's, or a blocker is locked FOR SHARE without
 * waiting: the one found at insert while it still is one (this transaction
 * holds the table: its block is still there), else the nearest found
 * again.  False: release it.
 */
static bool
qbop_held(Relation heap, const QbpKey *e)
{
	bool		own = false;
	ItemPointerData tid;
	Datum		key;
	TupleTableSlot *slot;
	bool		held;

	if (e->own_blocker)
		return true;
	key = CStringGetTextDatum(e->rowkey);
	slot = table_slot_create(heap, NULL);
	tid = e->blocker;
	/* the slot keeps the row pinned until it is locked (no prune moves it) */
	held = qbop_check(heap, &tid, key, e->dest, e->first_id, slot, &own) &&
		(own || qbop_lock(heap, &tid, slot));
	/* else it ended since, when no other is found */
	if (!held && qbop_blocker(heap, key, e->dest, e->first_id, &own, &tid, slot))
		held = own || qbop_lock(heap, &tid, slot);
	ExecDropSingleTupleTableSlot(slot);
	return held;
}

/*
 * qbop_release: the rows ids, parked by this transaction, are released as
 * a promotion releases a row.
 */
static void
qbop_release(Datum *ids, int n)
{
	Oid			types[1] = {INT8ARRAYOID};
	Datum		args[1];
	int			rc;

	args[0] = PointerGetDatum(construct_array(ids, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "queuebox: SPI_connect failed");
	/* at PRE_COMMIT no statement is running: the rows are this transaction's */
	PushActiveSnapshot(GetTransactionSnapshot());
	rc = SPI_execute_with_args("UPDATE queuebox.outbox"
							   " SET hold = CASE WHEN destination IS NULL THEN 'ready' END"
							   " WHERE id = ANY ($1) AND state = 'pending' AND hold = 'key'",
							   1, types, args, NULL, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "queuebox: the release of rows parked at insert failed: %s",
			 SPI_result_code_string(rc));
	PopActiveSnapshot();
	SPI_finish();
}

/*
 * qb_park_pre_commit: PRE_COMMIT (prepare false) or PRE_PREPARE (true) of
 * a transaction that parked rows at insert; see the banner.
 */
void
qb_park_pre_commit(bool prepare)
{
	HASH_SEQ_STATUS seq;
	QbpKey	   *e;
	Relation	heap;
	Datum	   *ids;
	int			n = 0;

	if (!qbop_have_first && qbop_keys == NULL)
		return;
	heap = table_open(qbop_outbox, RowExclusiveLock);
	ids = palloc(sizeof(Datum) * (1 + (qbop_keys != NULL ? hash_get_num_entries(qbop_keys) : 0)));
	if (qbop_have_first && (prepare ? !qbop_first.own_blocker : !qbop_held(heap, &qbop_first)))
		ids[n++] = Int64GetDatum(qbop_first.first_id);
	if (qbop_keys != NULL)
	{
		hash_seq_init(&seq, qbop_keys);
		while ((e = hash_seq_search(&seq)) != NULL)
			if (prepare ? !e->own_blocker : !qbop_held(heap, e))
				ids[n++] = Int64GetDatum(e->first_id);
	}
	table_close(heap, NoLock);
	qb_park_forget();			/* the release below parks nothing */
	if (n > 0)
	{
		qbop_release(ids, n);
		qb_note_outbox_row(false);	/* claimable now: wake a worker at commit */
	}
	pfree(ids);
}

/* qb_park_forget_sub: subtransaction subid rolled back. */
void
qb_park_forget_sub(SubTransactionId subid)
{
	HASH_SEQ_STATUS seq;
	QbpKey	   *e;

	/* a later park of its key records it again, in the table if need be */
	if (qbop_have_first && qbop_first.subid >= subid)
		qbop_have_first = false;
	if (qbop_keys == NULL)
		return;
	hash_seq_init(&seq, qbop_keys);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->subid >= subid)
			(void) hash_search(qbop_keys, &e->key, HASH_REMOVE, NULL);
}

/* qb_park_forget: the transaction ended; its keys go with its memory. */
void
qb_park_forget(void)
{
	qbop_have_first = false;
	qbop_keys = NULL;
}
