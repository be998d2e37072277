/*-------------------------------------------------------------------------
 * test_limits.c
 *	  Unit tests of qb_limits.c, the destinations' limits shared by the
 *	  workers of one server: reservations under both limits, give-back,
 *	  places released at a publish's end, by a restarted worker and at a
 *	  dead one's reaping; a lock left by a process killed inside it, and
 *	  halfway through a reservation; two processes on one MAP_SHARED block
 *	  never given more than the limit.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "qb_clock.h"
#include "qb_limits.h"

#define MS	1000000LL

static QbLimits *
shared_block(void)
{
	void	   *p = mmap(NULL, sizeof(QbLimits), PROT_READ | PROT_WRITE,
						 MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	qb_limits_init(p);
	return p;
}

static void
test_reserve_both(void **state)
{
	QbLimits   *l = shared_block();
	QbLimitSpec spec = {{10, 5}, 3};
	int			a = qb_limits_holder(l, "outbox 0", 100);
	int			b = qb_limits_holder(l, "outbox 1", 101);
	int64_t		t = 1000 * MS;
	long		wait;

	(void) state;
	assert_true(a >= 0 && b >= 0 && a != b);
	/* places first: 3 of the 5 tokens */
	assert_int_equal(qb_limits_reserve(l, a, "partner", &spec, 100, t, &wait), 3);
	assert_int_equal(wait, -1);
	assert_int_equal(qb_limits_in_use(l, "partner"), 3);
	assert_int_equal(qb_limits_reserve(l, b, "partner", &spec, 1, t, &wait), 0);
	/* two publishes start and end, one reservation is given back unused */
	qb_limits_spent(l, a, "partner", &spec, 2, t);
	qb_limits_release(l, a, "partner");
	qb_limits_release(l, a, "partner");
	qb_limits_give(l, a, "partner", &spec, 1, t);
	assert_int_equal(qb_limits_in_use(l, "partner"), 0);
	/* the unused token came back: 2 + 1 */
	assert_int_equal(qb_limits_reserve(l, b, "partner", &spec, 100, t, &wait), 3);
	/* all places taken by b: a waits for a place */
	assert_int_equal(qb_limits_reserve(l, a, "partner", &spec, 1, t, &wait), 0);
	assert_int_equal(wait, -1);
	/* a release of a holder that holds none changes nothing */
	qb_limits_release(l, a, "partner");
	assert_int_equal(qb_limits_in_use(l, "partner"), 3);
	/* rate only: a token comes in 100 ms */
	spec.max_concurrent = 0;
	assert_int_equal(qb_limits_reserve(l, a, "other", &spec, 100, t, &wait), 5);
	assert_int_equal(qb_limits_reserve(l, a, "other", &spec, 1, t, &wait), 0);
	assert_int_equal(wait, 100);
	assert_int_equal(qb_limits_in_use(l, "other"), 0);
	munmap(l, sizeof(*l));
}

/* tokens reserved are out until spent: the bucket refills up to burst less them */
static void
test_tokens_out(void **state)
{
	QbLimits   *l = shared_block();
	QbLimitSpec spec = {{10, 5}, 0};
	int			a = qb_limits_holder(l, "outbox 0", 400);
	int			b = qb_limits_holder(l, "outbox 1", 401);
	int64_t		t = 1000 * MS;
	long		wait;

	(void) state;
	assert_int_equal(qb_limits_reserve(l, a, "d", &spec, 5, t, &wait), 5);
	/* a second later a's claim has not sent them: b gets none */
	assert_int_equal(qb_limits_reserve(l, b, "d", &spec, 5, t + 1000 * MS, &wait), 0);
	/* a sends them: they count as taken now, the bucket refills from now */
	qb_limits_spent(l, a, "d", &spec, 5, t + 1000 * MS);
	assert_int_equal(qb_limits_reserve(l, b, "d", &spec, 5, t + 1000 * MS, &wait), 0);
	assert_int_equal(qb_limits_reserve(l, b, "d", &spec, 5, t + 1300 * MS, &wait), 3);
	/* b restarts (killed -9) with its 3 out: they stop being out */
	assert_int_equal(qb_limits_holder(l, "outbox 1", 402), b);
	assert_int_equal(qb_limits_reserve(l, a, "d", &spec, 5, t + 1500 * MS, &wait), 2);
	/* given back unused: in the bucket again, at once */
	qb_limits_give(l, a, "d", &spec, 2, t + 1500 * MS);
	assert_int_equal(qb_limits_reserve(l, b, "d", &spec, 5, t + 1500 * MS, &wait), 2);
	qb_limits_spent(l, b, "d", &spec, 2, t + 1500 * MS);
	assert_int_equal(qb_limits_reserve(l, a, "d", &spec, 9, t + 9000 * MS, &wait), 5);
	munmap(l, sizeof(*l));
}

static void
test_restart_and_reap(void **state)
{
	QbLimits   *l = shared_block();
	QbLimitSpec spec = {{0, 0}, 4};
	int64_t		t = qb_now_ns();
	long		wait;
	int			a = qb_limits_holder(l, "outbox 0", 200);
	int			b = qb_limits_holder(l, "outbox 1", 201);

	(void) state;
	assert_int_equal(qb_limits_reserve(l, a, "d", &spec, 2, t, &wait), 2);
	assert_int_equal(qb_limits_reserve(l, b, "d", &spec, 2, t, &wait), 2);
	/* outbox 0 restarts (killed -9): its name gives back what it held */
	assert_int_equal(qb_limits_holder(l, "outbox 0", 300), a);
	assert_int_equal(qb_limits_in_use(l, "d"), 2);
	/* outbox 1 dies: its supervisor reaps pid 201 */
	qb_limits_pid_end(l, 201);
	assert_int_equal(qb_limits_in_use(l, "d"), 0);
	qb_limits_pid_end(l, 999);	/* no such holder: nothing */
	/* a worker's own end */
	assert_int_equal(qb_limits_reserve(l, a, "d", &spec, 9, t, &wait), 4);
	qb_limits_holder_end(l, a);
	assert_int_equal(qb_limits_in_use(l, "d"), 0);
	munmap(l, sizeof(*l));
}

/*
 * die_in_lock: a child takes slot 0's lock as qblim_lock does and is killed
 * -9 inside it; mid_change: as a holder of its own, after the first store of
 * a reservation's two (the count of places raised, its own share not yet).
 * Returns its pid, reaped.
 */
static pid_t
die_in_lock(QbLimits *l, bool mid_change)
{
	pid_t		pid = fork();
	int			status;

	if (pid == 0)
	{
		if (mid_change)
			qb_limits_holder(l, "outbox 1", getpid());
		__atomic_store_n(&l->slots[0].lock, (uint32_t) getpid(), __ATOMIC_RELEASE);
		if (mid_change)
			l->slots[0].in_use++;
		raise(SIGKILL);
		_exit(0);
	}
	waitpid(pid, &status, 0);
	assert_true(WIFSIGNALED(status));
	return pid;
}

/* a process killed -9 while it held a slot's lock: a waiter takes it over */
static void
test_dead_lock_holder(void **state)
{
	QbLimits   *l = shared_block();
	QbLimitSpec spec = {{0, 0}, 1};
	long		wait;
	int			h = qb_limits_holder(l, "outbox 0", getpid());
	pid_t		pid;

	(void) state;
	assert_int_equal(qb_limits_reserve(l, h, "d", &spec, 1, qb_now_ns(), &wait), 1);
	pid = die_in_lock(l, false);
	assert_int_equal(l->slots[0].lock, (uint32_t) pid);
	qb_limits_release(l, h, "d");
	assert_int_equal(qb_limits_in_use(l, "d"), 0);
	assert_int_equal(l->slots[0].lock, 0);
	munmap(l, sizeof(*l));
}

/*
 * a role killed -9 halfway through a reservation: once the supervisor reaps
 * it, the place is free again (else maxConcurrent 1 would take no row until
 * a restart)
 */
static void
test_dead_mid_change(void **state)
{
	QbLimits   *l = shared_block();
	QbLimitSpec spec = {{0, 0}, 1};
	long		wait;
	int			h = qb_limits_holder(l, "outbox 0", getpid());

	(void) state;
	assert_int_equal(qb_limits_reserve(l, h, "d", &spec, 1, qb_now_ns(), &wait), 1);
	qb_limits_release(l, h, "d");
	qb_limits_pid_end(l, die_in_lock(l, true));	/* the supervisor's reap */
	assert_int_equal(l->slots[0].lock, 0);
	assert_int_equal(qb_limits_in_use(l, "d"), 0);
	assert_int_equal(qb_limits_reserve(l, h, "d", &spec, 1, qb_now_ns(), &wait), 1);
	munmap(l, sizeof(*l));
}

/* two processes reserve and release as fast as they can: never above maxConcurrent */
static void
test_two_processes(void **state)
{
	QbLimits   *l = shared_block();
	QbLimitSpec spec = {{1000000, 1000000}, 3};
	uint32_t   *over = mmap(NULL, sizeof(uint32_t), PROT_READ | PROT_WRITE,
							MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t		kids[2];

	(void) state;
	*over = 0;
	for (int k = 0; k < 2; k++)
		if ((kids[k] = fork()) == 0)
		{
			char		name[16] = "outbox x";
			int			h;
			long		wait;

			name[7] = (char) ('0' + k);
			h = qb_limits_holder(l, name, getpid());
			for (int i = 0; i < 20000; i++)
			{
				int			n = qb_limits_reserve(l, h, "d", &spec, 2, qb_now_ns(), &wait);

				if (qb_limits_in_use(l, "d") > 3)
					__atomic_add_fetch(over, 1, __ATOMIC_RELAXED);
				while (n-- > 0)
					qb_limits_release(l, h, "d");
			}
			_exit(0);
		}
	for (int k = 0; k < 2; k++)
	{
		int			status;

		waitpid(kids[k], &status, 0);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	assert_int_equal(*over, 0);
	assert_int_equal(qb_limits_in_use(l, "d"), 0);
	munmap(over, sizeof(uint32_t));
	munmap(l, sizeof(*l));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reserve_both),
		cmocka_unit_test(test_tokens_out),
		cmocka_unit_test(test_restart_and_reap),
		cmocka_unit_test(test_dead_lock_holder),
		cmocka_unit_test(test_dead_mid_change),
		cmocka_unit_test(test_two_processes),
	};

	return cmocka_run_group_tests_name("qb_limits", tests, NULL, NULL);
}
