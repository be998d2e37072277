# 057_config_file.pl
#   The configuration from a file (docs/configuration.md, "From a file"):
#   - extension: queuebox.config_file set by ALTER SYSTEM and a reload; the
#     workers read the file, copy it into queuebox.config and deliver by it;
#     config_source() says file, path, when, SHA-256; configure() refuses
#     with a hint; an invalid file (SIGHUP; the one the page shows) is
#     logged with its key path, in the very line the page shows, the
#     running configuration stays and delivers (rows counted before and
#     after), config_source() shows the error; fixing the file takes effect
#     at the next reload; a restart reads the file; only a superuser's
#     setting, absolute; RESET gives configure() back;
#   - daemon: the same load record in /metrics (last reload successful, its
#     time, failures, the SHA-256 of the file in force) across a bad and a
#     good SIGHUP.
use strict;
use warnings;

use Digest::SHA qw(sha256_hex);
use HTTP::Tiny;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $sink = qb_sink_start(name => 'cfgfile');
my $listen = qb_free_port();

sub doc
{
	my ($path, %o) = @_;
	return qb_config_yaml(
		http => { listen => "127.0.0.1:$listen" },
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => $path, timeoutMs => 5000 } },
		routes => [ { topicPattern => 'orders.**', destination => 'web' } ],
		%o);
}

sub write_file
{
	my ($path, $text) = @_;
	open(my $fh, '>', "$path.tmp") or die "$path: $!";
	print $fh $text;
	close $fh;
	rename("$path.tmp", $path) or die "rename $path: $!";
}

sub sink_paths
{
	my %n;
	$n{ $_->{path} }++ for grep { $_->{status} == 200 } @{ qb_sink_requests($sink) };
	return \%n;
}

# ---- the extension
my $node = qb_node('cfgfile');
my $file = "$PostgreSQL::Test::Utils::tmp_check/queuebox_057.yaml";
my $doc_a = doc('/a');
# the daemon's sections, as every daemon example writes them: the extension
# ignores them, and expands none of their variables (set only for the daemon)
my $doc_b = doc('/b', database => { url => 'postgres://queuebox:${QB_057_DAEMON_ONLY}@db.internal:5432/app' },
	daemon => { outboxWorkers => 4 });

qb_configure($node, doc('/table'));
qb_wait_query($node, q{SELECT source, loaded_at IS NOT NULL, path IS NULL FROM queuebox.config_source()},
	'table|t|t', 'configure(): config_source() says table, loaded, no path');

write_file($file, $doc_a);
my ($ret, $out, $err) = $node->psql('postgres', "SET queuebox.config_file = '$file'");
like($err, qr/parameter "queuebox\.config_file" cannot be changed now/, 'no session may SET the file');
($ret, $out, $err) = $node->psql('postgres', q{ALTER SYSTEM SET queuebox.config_file = 'queuebox.yaml'});
like($err, qr/queuebox\.config_file must be an absolute path/, 'a relative path is refused');

$node->safe_psql('postgres', "ALTER SYSTEM SET queuebox.config_file = '$file'");
$node->reload;
my $sha_a = sha256_hex($doc_a);
qb_wait_query($node, q{SELECT source, path, sha256, last_error IS NULL FROM queuebox.config_source()},
	"file|$file|$sha_a|t", 'a reload: the workers read the file; config_source() says file, its path and SHA-256');
is($node->safe_psql('postgres', q{SELECT document = } . qb_sql_quote($doc_a) . q{ AND updated_by = 'queuebox.config_file' FROM queuebox.config}),
	't', 'the file is copied into queuebox.config, which says by whom');
is($node->safe_psql('postgres', q{SELECT queuebox.route_of('orders.created')}), 'web', 'route_of() follows it');

$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.created', jsonb_build_object('n', g) FROM generate_series(1, 3) g});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '3', 'rows are delivered by the file');
is(sink_paths()->{'/a'}, 3, 'to the path the file names');

($ret, $out, $err) = $node->psql('postgres', 'SELECT queuebox.configure(' . qb_sql_quote(doc('/x')) . ')');
isnt($ret, 0, 'configure() refuses while the file is set');
like($err, qr/queuebox\.configure\(\) is disabled while queuebox\.config_file is set/, 'it says why');
like($err, qr/HINT:  Edit that file and run SELECT pg_reload_conf\(\)/, 'and what to do');
is($node->safe_psql('postgres', q{SELECT document = } . qb_sql_quote($doc_a) . q{ FROM queuebox.config}), 't',
	'the refused configure() changed nothing');

# an invalid file, the one docs/configuration.md shows ("An invalid file"):
# logged with its key path, as the page shows; the running configuration stays
my $page = slurp_file("$FindBin::RealBin/../../../docs/configuration.md");
my ($bad) = $page =~ /<!-- docs-test: config-file-invalid .*?-->\n```yaml invalid\n(.*?)^```$/ms;
my ($shown) = $page =~ /<!-- docs-test: config-file-warning .*?-->\n```\n(.*?)\n```$/ms;
ok(defined $bad && defined $shown, 'docs/configuration.md shows an invalid file and the warning it gives');
$shown =~ s{/etc/queuebox/queuebox\.yaml}{$file}g;
write_file($file, $bad);
my $offset = -s $node->logfile;
$node->reload;
qb_wait_query($node, q{SELECT last_error LIKE '%destinations.web.timeoutMS%' AND last_error_at IS NOT NULL FROM queuebox.config_source()},
	't', 'an invalid file: config_source() shows the error with its key path');
my $log = qb_wait_log($node, qr/WARNING:  queuebox outbox 0: could not load the configuration/, $offset);
my ($logged) = $log =~ /(WARNING:  queuebox outbox 0: could not load the configuration [^\n]*)/;
is($logged, $shown, 'the server log has the line docs/configuration.md shows, word for word');
like($log, qr/could not load the configuration \(queuebox\.config_file \Q$file\E: .*destinations\.web\.timeoutMS.*keeping the previous one/,
	'the server log names the file and the key path, and says the previous configuration stays');
# every worker reads the file and logs the failure; /metrics counts one
qb_wait_for(sub { my @l = (slurp_file($node->logfile, $offset) =~ /could not load the configuration \(queuebox\.config_file/g); @l >= 3 },
	'the outbox workers and the ingress each met the invalid file', timeout => 60);
my $ext_metrics = HTTP::Tiny->new(timeout => 10)->get("http://127.0.0.1:$listen/metrics")->{content} // '';
like($ext_metrics, qr/^queuebox_config_reload_failures_total 1$/m, 'one bad reload is one failure in /metrics, however many workers met it');
like($ext_metrics, qr/^queuebox_config_last_reload_successful 0$/m, 'and the last reload is not successful');
my ($in_parens) = $shown =~ /could not load the configuration \((.*)\); keeping the previous one$/;
is($node->safe_psql('postgres', q{SELECT last_error FROM queuebox.config_source()}), $in_parens,
	'config_source().last_error is the text in its parentheses, as the page says');
is($node->safe_psql('postgres', q{SELECT sha256 FROM queuebox.config_source()}), $sha_a, 'the SHA-256 in force is still the good file\'s');
is($node->safe_psql('postgres', q{SELECT document = } . qb_sql_quote($doc_a) . q{ FROM queuebox.config}), 't',
	'queuebox.config keeps the good document');
my $before = qb_outbox_count($node);
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.created', jsonb_build_object('n', g) FROM generate_series(4, 5) g});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '5',
	'the running configuration still delivers');
is(qb_outbox_count($node), $before + 2, 'every row is there');
is(sink_paths()->{'/a'}, 5, 'by the good file\'s destination');

# fixed: the next reload takes it
write_file($file, $doc_b);
$node->reload;
my $sha_b = sha256_hex($doc_b);
qb_wait_query($node, q{SELECT sha256, last_error IS NULL FROM queuebox.config_source()}, "$sha_b|t",
	'the fixed file is loaded at the next reload, the error cleared');
ok(!defined $ENV{QB_057_DAEMON_ONLY}, 'its database.url names a variable the server does not have, and that is no error');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.created', '{"n": 6}')});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '6', 'and delivers by it');
is(sink_paths()->{'/b'}, 1, 'to its path');

# a restart reads the file
$node->restart;
qb_wait_query($node, q{SELECT source || ' ' || sha256 FROM queuebox.config_source()}, "file $sha_b",
	'after a restart the workers read the file again');

# the reader role may look
$node->safe_psql('postgres', q{CREATE ROLE looker LOGIN IN ROLE queuebox_reader});
is($node->safe_psql('postgres', q{SELECT source FROM queuebox.config_source()}, extra_params => ['-U', 'looker']),
	'file', 'queuebox_reader may call config_source()');
$node->safe_psql('postgres', q{CREATE ROLE nobody LOGIN; GRANT USAGE ON SCHEMA queuebox TO nobody});
($ret, $out, $err) = $node->psql('postgres', q{SELECT * FROM queuebox.config_source()}, extra_params => ['-U', 'nobody']);
like($err, qr/permission denied for function config_source/, 'a role without it may not');

# reset: configure() again
$node->safe_psql('postgres', q{ALTER SYSTEM RESET queuebox.config_file});
$node->reload;
qb_wait_query($node, q{SELECT current_setting('queuebox.config_file')}, '', 'the file is reset');
qb_configure($node, doc('/table2'));
qb_wait_query($node, q{SELECT source, path IS NULL FROM queuebox.config_source()}, 'table|t',
	'configure() stores documents again; config_source() says table');
$node->stop;

# ---- the daemon: the load record in /metrics
my $dn = qbd_node('cfgfiled');
my $url = qbd_url($dn);
my $port = qb_free_port();
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
my $ddoc = doc('/d', database => { url => $url }, http => { listen => "127.0.0.1:$port" });
my $d = qbd_start($dn, $ddoc, name => 'cfgfile');
my $dsha = sha256_hex($ddoc);
my $metrics = sub { my $r = $http->get("http://127.0.0.1:$port/metrics"); $r->{success} ? $r->{content} : '' };
qb_wait_for(sub { $metrics->() =~ /^queuebox_config_info\{source="file",sha256="$dsha"\} 1$/m },
	'daemon: /metrics names the file in force by its SHA-256', timeout => 60);
like($metrics->(), qr/^queuebox_config_last_reload_successful 1$/m, 'daemon: the last load succeeded');

my $dbad = $ddoc;
$dbad =~ s/timeoutMs:/timeoutMS:/ or die 'no timeoutMs';
write_file($d->{conf}, $dbad);
my $doff = -s $d->{log};
qbd_signal($d, 'HUP');
qb_wait_for(sub { $metrics->() =~ /^queuebox_config_last_reload_successful 0$/m },
	'daemon: an invalid file at SIGHUP: last reload not successful', timeout => 30);
like($metrics->(), qr/^queuebox_config_reload_failures_total 1$/m, 'daemon: one failure counted');
like($metrics->(), qr/^queuebox_config_info\{source="file",sha256="$dsha"\} 1$/m, 'daemon: the good file stays in force');
like(qbd_wait_daemon_log($d, qr/configuration not reloaded/, $doff), qr/configuration not reloaded, the running one stays: .*destinations\.web\.timeoutMS/,
	'daemon: the log names the key path');
$before = qb_outbox_count($dn);
$dn->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.created', jsonb_build_object('n', g) FROM generate_series(1, 2) g});
qb_wait_query($dn, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '2', 'daemon: the running configuration delivers');
is(qb_outbox_count($dn), $before + 2, 'daemon: every row is there');

my $dgood = doc('/d2', database => { url => $url }, http => { listen => "127.0.0.1:$port" });
write_file($d->{conf}, $dgood);
qbd_signal($d, 'HUP');
my $dsha2 = sha256_hex($dgood);
qb_wait_for(sub { my $m = $metrics->(); $m =~ /^queuebox_config_info\{source="file",sha256="$dsha2"\} 1$/m && $m =~ /^queuebox_config_last_reload_successful 1$/m },
	'daemon: the fixed file loads at the next SIGHUP', timeout => 30);
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);

done_testing();
