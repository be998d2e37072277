# 058_egress.pl
#   Egress rules (docs/operations.md, "Egress rules"), on the extension
#   (queuebox.allowed_destinations) and the daemon (egress.allow):
#   - by default a metadata address is refused at configure time, with the
#     key path, the address and the setting to change;
#   - a name the rules allow passes configure, but when it resolves to an
#     address the rules refuse (localhost, while only 10.0.0.0/8 is listed),
#     the connection is refused: rows counted before and after, none sent,
#     none lost, last_error says why; listing the address delivers them;
#   - the setting is the superuser's: no session may SET it, and the
#     extension refuses a document's egress: section;
#   - a list of names only refuses every host written as an address, in
#     each spelling resolvers accept (IPv4, IPv6, IPv4-mapped, NAT64,
#     decimal, octal, hex, short) and a name that is not listed, at
#     configure time on both hosts; and at connect time: a document stored
#     before the list was narrowed keeps being used, but its address host
#     is refused (rows counted, none sent), until the list allows it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxKafka;

my $sink = qb_sink_start(name => 'egress');
(my $by_name = $sink->{url}) =~ s{//127\.0\.0\.1:}{//localhost:} or die "sink url $sink->{url}";

sub doc
{
	my ($base, %o) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 100, backoff => { initialMs => 100, maxMs => 200 } },
		destinations => { web => { type => 'http', baseUrl => $base, path => '/in', timeoutMs => 2000 } },
		routes => [ { topicPattern => 'orders.**', destination => 'web' } ],
		%o);
}

# ---- the extension
my $node = qb_node('egress');
my ($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure(\$\$" . doc('http://169.254.169.254') . "\$\$)");
isnt($ret, 0, 'default rules: a metadata address is refused at configure time');
like($err, qr/destinations\.web\.baseUrl: egress refused: 169\.254\.169\.254 is a link-local or cloud metadata address; list it in queuebox\.allowed_destinations to allow it/,
	'the refusal names the key path, the address and the setting');
($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure(\$\$"
	  . doc($sink->{url}, egress => { allow => ['0.0.0.0/0'] }) . "\$\$)");
like($err, qr/egress: this host takes its egress rules from queuebox\.allowed_destinations/,
	'the extension refuses a document that would set its own rules');
($ret, $out, $err) = $node->psql('postgres', q{SET queuebox.allowed_destinations = '0.0.0.0/0'});
like($err, qr/parameter "queuebox\.allowed_destinations" cannot be changed now/, 'no session may SET the rules');

$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'localhost, 10.0.0.0/8'});
$node->reload;
qb_wait_query($node, q{SHOW queuebox.allowed_destinations}, 'localhost, 10.0.0.0/8', 'the rules are reloaded');
($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure(\$\$" . doc($sink->{url}) . "\$\$)");
like($err, qr/destinations\.web\.baseUrl: egress refused: 127\.0\.0\.1 is in no network of queuebox\.allowed_destinations/,
	'an address literal outside the listed networks is refused at configure time');
qb_configure($node, doc($by_name));
my $before = qb_sink_stats($sink)->{requests} // 0;
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.created', jsonb_build_object('n', g) FROM generate_series(1, 3) g});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE attempt >= 2 AND last_error LIKE '%egress refused: % is in no network of queuebox.allowed_destinations%'},
	'3', 'a listed name resolving to an unlisted address: each attempt is refused at connect time, and last_error says so');
is($node->safe_psql('postgres', q{SELECT count(*) || '/' || count(*) FILTER (WHERE state = 'pending') FROM queuebox.outbox}),
	'3/3', 'the refused rows are all there, pending');
is(qb_sink_stats($sink)->{requests} // 0, $before, 'the sink got no request');

$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'localhost, 127.0.0.1/32'});
$node->reload;
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '3',
	'listing the address: the same rows are delivered');
is(qb_sink_stats($sink)->{requests} - $before, 3, 'the sink got each row once');

# a broker: librdkafka's connect callback judges each broker address
my $kafka = qb_kafka_start(topics => ['eg:1']);
(my $kafka_by_name = $kafka->{bootstrap}) =~ s/127\.0\.0\.1/localhost/g;
$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'localhost, 10.0.0.0/8'});
$node->reload;
qb_wait_query($node, q{SHOW queuebox.allowed_destinations}, 'localhost, 10.0.0.0/8', 'the rules are narrowed again');
qb_configure($node, qb_config_yaml(
	outbox => { pollIntervalMs => 100, maxAttempts => 100, backoff => { initialMs => 100, maxMs => 200 } },
	destinations => { bus => { type => 'kafka', brokers => $kafka_by_name, topic => 'eg',
		config => { 'message.timeout.ms' => '1000' }, circuitBreaker => { failures => 100000 } } },
	routes => [ { topicPattern => 'orders.**', destination => 'bus' } ]));
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.kafka', '{"k": 1}')});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.kafka' AND state = 'pending'
	AND last_error LIKE '%egress refused: % is in no network of queuebox.allowed_destinations%'},
	'1', 'kafka: the broker address is refused at connect time; the row stays pending and last_error says why');
$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'localhost, 127.0.0.1/32, ::1/128'});
$node->reload;
qb_wait_query($node, q{SELECT state FROM queuebox.outbox WHERE topic = 'orders.kafka'}, 'sent',
	'kafka: listing the address delivers the row', timeout => 90);
qb_kafka_stop($kafka);

# ---- docs/operations.md's example, run as written
my ($egress_sql) = slurp_file("$FindBin::RealBin/../../../docs/operations.md") =~ /^### Egress rules\n.*?^```sql\n(.*?)^```/ms
  or die 'docs/operations.md: no sql block under "### Egress rules"';
$node->safe_psql('postgres', $egress_sql);
qb_wait_query($node, q{SHOW queuebox.allowed_destinations}, '10.20.0.0/16, hooks.partner.example',
	'operations.md\'s ALTER SYSTEM and reload set the list');
($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure(\$\$" . doc('http://10.1.2.3:8080') . "\$\$)");
like($err, qr/egress refused: 10\.1\.2\.3 is in no network of queuebox\.allowed_destinations/,
	'operations.md\'s list: an address outside its network is refused');
($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.validate(\$\$" . doc('https://hooks.partner.example/in') . "\$\$)");
is($ret, 0, 'operations.md\'s list: its name may be configured') or diag $err;

# ---- a list of names only: an address host is refused, however it is spelled
(my $port = $sink->{url}) =~ s{.*:(\d+)$}{$1} or die "sink url $sink->{url}";
my @address_hosts = ("127.0.0.1:$port", "[::1]:$port", "[::ffff:127.0.0.1]:$port", "[64:ff9b::7f00:1]:$port",
	"2130706433:$port", "0x7f000001:$port", "0177.0.0.1:$port", "127.1:$port", "0x7f.1:$port");
$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'hooks.partner.example'});
$node->reload;
qb_wait_query($node, q{SHOW queuebox.allowed_destinations}, 'hooks.partner.example', 'names only: the list is reloaded');
my $config_before = $node->safe_psql('postgres', q{SELECT md5(document) FROM queuebox.config});
for my $h (@address_hosts)
{
	($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure(\$\$" . doc("http://$h") . "\$\$)");
	like($err, qr/destinations\.web\.baseUrl: egress refused: \S+( \(127\.0\.0\.1\))? is an address, and queuebox\.allowed_destinations lists names only; add the address \(or a network that holds it\) there to allow it/,
		"names only: configure() refuses http://$h");
}
($ret, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure(\$\$" . doc("http://localhost:$port") . "\$\$)");
like($err, qr/egress refused: the host localhost is not among the names of queuebox\.allowed_destinations/,
	'names only: a name that is not listed is refused, whatever it resolves to');
is($node->safe_psql('postgres', q{SELECT md5(document) FROM queuebox.config}), $config_before,
	'names only: no refused document was stored');

# connect time: a document stored before the list was narrowed
$node->safe_psql('postgres', q{ALTER SYSTEM RESET queuebox.allowed_destinations});
$node->reload;
qb_wait_query($node, q{SHOW queuebox.allowed_destinations}, '', 'the list is empty again');
qb_configure($node, doc($sink->{url}));
$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'hooks.partner.example'});
$node->reload;
qb_wait_query($node, q{SHOW queuebox.allowed_destinations}, 'hooks.partner.example', 'names only again');
$before = qb_sink_stats($sink)->{requests};
my $rows_before = $node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox});
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.literal', jsonb_build_object('n', g) FROM generate_series(1, 3) g});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.literal' AND state = 'pending' AND attempt >= 2
	AND last_error LIKE '%egress refused: 127.0.0.1 is an address, and queuebox.allowed_destinations lists names only%'},
	'3', 'names only, connect time: the stored document\'s address host is refused; the rows stay pending and last_error says why');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox}), $rows_before + 3, 'names only: every row is still there');
is(qb_sink_stats($sink)->{requests}, $before, 'names only: the sink got no request');
$node->safe_psql('postgres', q{ALTER SYSTEM SET queuebox.allowed_destinations = 'hooks.partner.example, 127.0.0.1'});
$node->reload;
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.literal' AND state = 'sent'}, '3',
	'names only: listing the address delivers the same rows');
is(qb_sink_stats($sink)->{requests} - $before, 3, 'names only: the sink got each row once');
$node->stop;

# ---- the daemon: egress.allow
my $dn = qbd_node('egressd');
my $url = qbd_url($dn);
my $r = qbd_run('--config', qbd_write_conf(doc('http://169.254.169.254', database => { url => $url }), 'meta'), '--check');
is($r->[0], 1, 'daemon: a metadata address fails --check');
like($r->[2], qr/destinations\.web\.baseUrl: egress refused: 169\.254\.169\.254 is a link-local or cloud metadata address; list it in egress\.allow/,
	'daemon: the refusal names egress.allow');

# the daemon: egress.allow with names only
for my $h ('10.1.2.3:8080', "[::1]:$port", "[::ffff:127.0.0.1]:$port", "2130706433:$port", "0x7f.1:$port")
{
	$r = qbd_run('--config', qbd_write_conf(doc("http://$h", database => { url => $url },
		egress => { allow => ['hooks.partner.example'] }), 'names'), '--check');
	is($r->[0], 1, "daemon, names only: http://$h fails --check");
	like($r->[2], qr/destinations\.web\.baseUrl: egress refused: \S+( \(\S+\))? is an address, and egress\.allow lists names only/,
		"daemon, names only: the refusal of http://$h names egress.allow");
}
my $d = qbd_start($dn, doc($by_name, database => { url => $url }, egress => { allow => [ 'localhost', '10.0.0.0/8' ] }), name => 'egress');
qb_wait_query($dn, q{SELECT to_regclass('queuebox.outbox') IS NOT NULL}, 't', 'daemon: the schema is there');
$before = qb_sink_stats($sink)->{requests};
$dn->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.created', jsonb_build_object('n', g) FROM generate_series(1, 2) g});
qb_wait_query($dn, q{SELECT count(*) FROM queuebox.outbox WHERE attempt >= 2 AND state = 'pending' AND last_error LIKE '%egress refused: % is in no network of egress.allow%'},
	'2', 'daemon: connections to an unlisted address are refused, the rows stay pending');
is(qb_sink_stats($sink)->{requests}, $before, 'daemon: the sink got no request');
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);

done_testing();
