/*-------------------------------------------------------------------------
 * outbox_park.c
 *	  Parked at insert: a new keyed row whose key has an earlier open row
 *	  is inserted parked (hold 'key'), so no claim ever reads it
 *	  (docs/design/claim.md, "Parked at insert").
 *
 * Wording:
 *	- open: pending or processing, or dead and holding its key (hold
 *	  'dead'): the predicate of outbox_key_open_idx.
 *	- the blocker of a row: the nearest earlier (lower id) open row of its
 *	  key, found by one backward probe of outbox_key_open_idx as of now
 *	  (SnapshotSelf: every committed row, and this transaction's own, the
 *	  rows of the running statement included).
 *	- a parked key: a key of which this transaction parked a row at insert;
 *	  its first parked row (the lowest id), and whether that row's blocker
 *	  was a row of this transaction.
 *
 * Why a park made here is never lost.  The blocker's end promotes its
 * key's first open row (QB_PG_OUTBOX_PROMOTE, a statement after the settle),
 * but a promotion cannot see a row whose transaction has not committed.
 * So at PRE_COMMIT, for each parked key whose blocker is not this
 * transaction's own row, the blocker is found again and locked FOR SHARE
 * without waiting, as the claim locks the row it parks behind:
 *	- locked: the blocker's end (an UPDATE) waits for this commit, and the
 *	  promotion after it sees the park;
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
 * drops the table at every end of the transaction.
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
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "qb_pg.h"

#define QBP_KEY_INDEX	"outbox_key_open_idx"

typedef struct QbpKey
{
	char	   *key;			/* hash key: a copy in TopTransactionContext */
	int64		first_id;		/* the lowest id parked */
	bool		own_blocker;	/* first_id's blocker is this transaction's */
	SubTransactionId subid;		/* the subtransaction that recorded it */
} QbpKey;

static HTAB *qbop_keys = NULL;
static Oid	qbop_outbox = InvalidOid;	/* the table the trigger ran on */

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

/*
 * qbop_blocker: the nearest open row of key (a text Datum) with an id below
 * id, as of now; *own says this transaction inserted it, *tid where it
 * is.  False when there is none, or when the index is missing (a schema
 * before 0.2.0: nothing is parked at insert then).
 */
static bool
qbop_blocker(Relation heap, Datum key, int64 id, bool *own, ItemPointer tid)
{
	Oid			idxoid = get_relname_relid(QBP_KEY_INDEX, RelationGetNamespace(heap));
	Relation	idx;
	ScanKeyData sk[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		found;

	if (!OidIsValid(idxoid))
		return false;
	idx = index_open(idxoid, AccessShareLock);
	ScanKeyEntryInitialize(&sk[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, key);
	ScanKeyEntryInitialize(&sk[1], 0, 2, BTLessStrategyNumber, InvalidOid,
						   idx->rd_indcollation[1], F_INT8LT, Int64GetDatum(id));
	slot = table_slot_create(heap, NULL);
	scan = qb_index_beginscan(heap, idx, SnapshotSelf, 2, 0);
	index_rescan(scan, sk, 2, NULL, 0);
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
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	return found;
}

/*
 * qb_park_at_insert: the outbox_route trigger's question for a new keyed
 * row (id, key) of heap: does an earlier row of its key keep it waiting?
 * True: the caller inserts it parked, and the key is recorded for
 * PRE_COMMIT.
 */
bool
qb_park_at_insert(Relation heap, int64 id, Datum key)
{
	bool		own = false;
	ItemPointerData tid;
	char	   *k;
	QbpKey	   *e;
	bool		found;

	if (!qbop_blocker(heap, key, id, &own, &tid))
		return false;
	if (qbop_keys == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(char *);
		ctl.entrysize = sizeof(QbpKey);
		ctl.hash = qbop_hash;
		ctl.match = qbop_match;
		ctl.keycopy = qbop_keycopy;
		ctl.hcxt = TopTransactionContext;
		qbop_keys = hash_create("queuebox parked keys", 64, &ctl,
							   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_KEYCOPY |
							   HASH_CONTEXT);
	}
	qbop_outbox = RelationGetRelid(heap);
	k = TextDatumGetCString(key);
	e = hash_search(qbop_keys, &k, HASH_ENTER, &found);
	if (!found || id < e->first_id)
	{
		e->first_id = id;
		e->own_blocker = own;
		e->subid = GetCurrentSubTransactionId();
	}
	pfree(k);
	return true;
}

/*
 * qbop_held: at PRE_COMMIT, e's first parked row keeps its place: its
 * blocker is this transaction's, or is found again and locked FOR SHARE
 * without waiting.  False: release it.
 */
static bool
qbop_held(Relation heap, const QbpKey *e)
{
	bool		own = false;
	ItemPointerData tid;
	TupleTableSlot *slot;
	TM_FailureData tmfd;
	TM_Result	r;

	if (e->own_blocker)
		return true;
	if (!qbop_blocker(heap, CStringGetTextDatum(e->key), e->first_id, &own, &tid))
		return false;			/* it ended since */
	if (own)
		return true;
	slot = table_slot_create(heap, NULL);
	r = table_tuple_lock(heap, &tid, GetLatestSnapshot(), slot, GetCurrentCommandId(true),
						 LockTupleShare, LockWaitSkip, 0, &tmfd);
	ExecDropSingleTupleTableSlot(slot);
	return r == TM_Ok;
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

	if (qbop_keys == NULL)
		return;
	heap = table_open(qbop_outbox, RowExclusiveLock);
	ids = palloc(sizeof(Datum) * hash_get_num_entries(qbop_keys));
	hash_seq_init(&seq, qbop_keys);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (prepare ? !e->own_blocker : !qbop_held(heap, e))
			ids[n++] = Int64GetDatum(e->first_id);
	table_close(heap, NoLock);
	qbop_keys = NULL;			/* the release below parks nothing */
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

	if (qbop_keys == NULL)
		return;
	hash_seq_init(&seq, qbop_keys);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->subid >= subid)
			(void) hash_search(qbop_keys, &e->key, HASH_REMOVE, NULL);
}

/* qb_park_forget: the transaction ended; its table went with its memory. */
void
qb_park_forget(void)
{
	qbop_keys = NULL;
}
