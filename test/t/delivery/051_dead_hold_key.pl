# 051_dead_hold_key.pl
#   onDead: holdKey (docs/delivery.md, "A dead row and its key"), end to end
#   against the HTTP sink.  A key whose head dies under holdKey delivers
#   nothing more, new rows included, until an operator acts: after an
#   edited requeue the sink receives the edited payload first, then the
#   rest of the key in order; a skip lets the key go on without its head;
#   a route's onDead wins over its destination's; release (the default)
#   lets the key go on at once, as before.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP qw(decode_json);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'holdkey');
my $node = qb_node('holdkey');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

qb_configure(
	$node,
	qb_config_yaml(
		outbox => { maxAttempts => 1 },
		destinations => {
			held => { type => 'http', baseUrl => $sink->{url}, path => '/held', onDead => 'holdKey' },
			rel => { type => 'http', baseUrl => $sink->{url}, path => '/rel' },
		},
		routes => [
			{ topicPattern => 'held.**', destination => 'held' },
			{ topicPattern => 'skip.**', destination => 'rel', onDead => 'holdKey' },
			{ topicPattern => 'free.**', destination => 'held', onDead => 'release' },
			{ topicPattern => 'rel.**', destination => 'rel' },
		]));

# per key: seq 0 fails (500, one attempt: dead), seq 1..3 would succeed
my @values;
for my $key (qw(held skip free rel))
{
	push @values, qq{('$key.x', '$key', '{"key": "$key", "seq": 0, "_sink": {"status": 500}}')};
	push @values, qq{('$key.x', '$key', '{"key": "$key", "seq": $_}')} for 1 .. 3;
}
$node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload) VALUES\n" . join(",\n", @values));
is(qb_outbox_count($node), 16, '16 rows inserted');

# ok requests per key, as "seq" (with "e" for an edited body), in log order
sub delivered
{
	my ($key) = @_;
	my @seq;
	for my $r (@{ qb_sink_requests($sink) })
	{
		next unless $r->{status} >= 200 && $r->{status} < 300;
		my $b = decode_json($r->{body});
		next unless ($b->{key} // '') eq $key;
		push @seq, $b->{seq} . ($b->{edited} ? 'e' : '');
	}
	return join(',', @seq);
}

sub requests_for
{
	my ($key) = @_;
	return scalar grep { my $b = eval { decode_json($_->{body}) }; $b && ($b->{key} // '') eq $key }
	  @{ qb_sink_requests($sink) };
}

sub states
{
	my ($key) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(payload->>'seq' || ':' || state || ':' || coalesce(hold, '-'), ',' ORDER BY id)
		FROM queuebox.outbox WHERE key = '$key'});
}

# ---- release: the default (rel) and a route's release over a holdKey destination (free)
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE key IN ('rel', 'free') AND state = 'sent'",
	6, 'release: the later rows of a key whose head died are sent', timeout => 60);
is(states('rel'), '0:dead:-,1:sent:-,2:sent:-,3:sent:-', 'release (default): head dead, holds nothing');
is(states('free'), '0:dead:-,1:sent:-,2:sent:-,3:sent:-',
	"a route's onDead: release wins over its destination's holdKey");
is(delivered('rel'), '1,2,3', 'release: the sink got 1, 2, 3');

# ---- holdKey: the head dies holding its key, nothing behind it goes out
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE key IN ('held', 'skip') AND state = 'dead' AND hold = 'dead'",
	2, 'holdKey: the dead heads hold their keys', timeout => 60);
# the rows behind were parked by the claims that met them (or are met now)
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE key IN ('held', 'skip') AND state = 'pending' AND hold = 'key'",
	6, 'holdKey: the later rows are parked behind the dead heads', timeout => 60);
is(states('held'), '0:dead:dead,1:pending:key,2:pending:key,3:pending:key',
	'holdKey (destination): head dead and holding, the rest parked');
is(states('skip'), '0:dead:dead,1:pending:key,2:pending:key,3:pending:key',
	"holdKey (a route's, over a release destination): the same");
is(requests_for('held'), 1, 'holdKey: the sink saw only the failed head of the held key');
is(requests_for('skip'), 1, 'holdKey: the sink saw only the failed head of the skipped key');

# a row added to a held key waits too
$node->safe_psql('postgres',
	q{INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('held.x', 'held', '{"key": "held", "seq": 4}')});
qb_wait_query($node,
	"SELECT hold FROM queuebox.outbox WHERE key = 'held' AND payload->>'seq' = '4'",
	'key', 'a new row of a held key is parked behind the dead head', timeout => 60);
is(requests_for('held'), 1, 'still nothing more sent for the held key');

is($node->safe_psql('postgres',
		q{SELECT string_agg(key || ':' || head_state || ':' || behind, ',' ORDER BY key) FROM queuebox.held_keys()}),
	'held:dead:4,skip:dead:3', 'held_keys() lists both keys, their dead heads and the rows behind');

# ---- an edited requeue: the edited head first, then the rest in order
my $head = $node->safe_psql('postgres',
	q{SELECT id FROM queuebox.outbox WHERE key = 'held' AND payload->>'seq' = '0'});
is($node->safe_psql('postgres',
		qq{SELECT queuebox.requeue_outbox($head, '{"key": "held", "seq": 0, "edited": true}')}),
	't', 'requeue_outbox(id, payload) answers true');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE key = 'held' AND state = 'sent'",
	5, 'the held key drains after the requeue', timeout => 60);
is(delivered('held'), '0e,1,2,3,4', 'the sink got the edited head first, then 1, 2, 3, 4 in order');
is(requests_for('held'), 6, 'the held key: 6 requests in all (the failure, then one per row)');
is($node->safe_psql('postgres', qq{
		SELECT action || ':' || (done_by = current_user) || ':' || (payload_before ? '_sink') || ':'
			   || (payload_after->>'edited')
		FROM queuebox.outbox_audit WHERE outbox_id = $head}),
	'requeue:true:true:true', 'the edit is audited: who, the payload before and after');

# ---- a skip: the head stays dead, the key goes on without it
my $shead = $node->safe_psql('postgres',
	q{SELECT id FROM queuebox.outbox WHERE key = 'skip' AND payload->>'seq' = '0'});
is($node->safe_psql('postgres', qq{SELECT queuebox.skip_outbox($shead)}), 't', 'skip_outbox(id) answers true');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE key = 'skip' AND state = 'sent'",
	3, 'the skipped key drains', timeout => 60);
is(states('skip'), '0:dead:-,1:sent:-,2:sent:-,3:sent:-', 'skip: the head stays dead, holding nothing');
is(delivered('skip'), '1,2,3', 'skip: the sink got 1, 2, 3 in order');
is($node->safe_psql('postgres', qq{SELECT action FROM queuebox.outbox_audit WHERE outbox_id = $shead}),
	'skip', 'the skip is audited');
is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.held_keys()'), '0', 'no key is held any more');

is(qb_outbox_count($node), 17, 'no row lost or added: 17 rows');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE state = 'dead'}),
	'3', 'dead: the heads of rel, free and skip');

$node->stop;
qb_sink_stop($sink);
done_testing();
