# 041_secret_files.pl
#   ${file:PATH} secrets end to end (issue 21): a webhook source's secret
#   read from a file, changed on disk and taken by a reload with no restart,
#   in the extension (queuebox.secret_file_dirs, pg_reload_conf()) and in
#   the daemon (SIGHUP, a path through ${CREDENTIALS_DIRECTORY}).  A refused
#   or vanished file changes nothing, and no secret reaches a log.
use strict;
use warnings;

use Digest::SHA qw(hmac_sha256_hex);
use File::Basename ();
use HTTP::Tiny;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
my $seq = 0;

sub write_secret
{
	my ($path, $secret) = @_;
	open(my $fh, '>', $path) or die "$path: $!";
	print $fh "$secret\n";			# as `echo` writes it
	close $fh;
}

# post_signed($port, $secret): a GitHub delivery signed with $secret; the status
sub post_signed
{
	my ($port, $secret) = @_;
	my $body = '{"action":"opened","n":' . (++$seq) . '}';
	my $r = $http->request('POST', "http://127.0.0.1:$port/inbox/github", {
		content => $body,
		headers => {
			'X-GitHub-Delivery' => "d-$$-$seq", 'X-GitHub-Event' => 'pull_request',
			'X-Hub-Signature-256' => 'sha256=' . hmac_sha256_hex($body, $secret) } });
	return $r->{status};
}

sub source_yaml
{
	my ($port, $secret_ref) = @_;
	return <<"EOY";
http: { listen: "127.0.0.1:$port" }
sources:
  gh:
    type: http
    path: /github
    idempotencyKeyHeader: X-GitHub-Delivery
    eventTypeHeader: X-GitHub-Event
    auth: { type: github, secret: "$secret_ref" }
EOY
}

my $dir = PostgreSQL::Test::Utils::tempdir('secrets');
my $outside = PostgreSQL::Test::Utils::tempdir('elsewhere');
write_secret("$dir/github", 'first-s3cr3t');
write_secret("$outside/github", 'outside-s3cr3t');
symlink("$outside/github", "$dir/escape") or die "symlink: $!";

# ---------------------------------------------------------------- extension
my $node = qb_node('secrets', workers => 0, conf => "queuebox.relay_worker = off\n");
my $port = qb_free_port();
my $doc = source_yaml($port, "\${file:$dir/github}");
my $q = qb_sql_quote($doc);

# the default allows no directory: refused, naming the key, the file and the setting
my ($rc, $out, $err) = $node->psql('postgres', "SELECT queuebox.configure($q)");
isnt($rc, 0, 'a file reference is refused while queuebox.secret_file_dirs is empty');
like($err, qr/sources\.gh\.auth\.secret: file reference \$\{file:\Q$dir\E\/github\}: no directory is allowed for secret files; a superuser sets queuebox\.secret_file_dirs/,
	'the refusal names the key path, the file and the setting');
is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.config'), '0', 'nothing was stored');

($rc, $out, $err) = $node->psql('postgres', "SET queuebox.secret_file_dirs = '/'");
like($err, qr/cannot be changed now/, 'a session cannot set queuebox.secret_file_dirs');

$node->safe_psql('postgres', "ALTER SYSTEM SET queuebox.secret_file_dirs = '/nonexistent, $dir'; SELECT pg_reload_conf()");
qb_wait_query($node, 'SHOW queuebox.secret_file_dirs', "/nonexistent, $dir", 'the server took the directories');

like(qb_configure($node, $doc), qr/configuration stored.*1 source/, 'configure() takes the file reference');
qb_wait_for(sub { $http->get("http://127.0.0.1:$port/healthz")->{status} == 200 }, 'the ingress listens', timeout => 30);
is(post_signed($port, 'first-s3cr3t'), 202, 'a delivery signed with the file\'s secret is accepted');
is(post_signed($port, 'first-s3cr3t' . "\n"), 401, 'the trailing newline of the file is not part of the secret');

# a new secret in the file: nothing changes until a reload, then it is in force
write_secret("$dir/github", 'second-s3cr3t');
is(post_signed($port, 'second-s3cr3t'), 401, 'the file is read when the configuration is loaded, not per request');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
qb_wait_for(sub { post_signed($port, 'second-s3cr3t') == 202 }, 'after pg_reload_conf() the new secret is verified (no restart)', timeout => 30);
is(post_signed($port, 'first-s3cr3t'), 401, 'the old secret is refused');

# refused paths change nothing: outside, through a symlink, through ..
my $stored = $node->safe_psql('postgres', 'SELECT document FROM queuebox.config');
for my $case ([ "$outside/github", qr/\Q$outside\E\/github is outside the directories queuebox\.secret_file_dirs allows/, 'a file outside' ],
	[ "$dir/escape", qr/\Q$outside\E\/github is outside the directories/, 'a symlink out of the directory' ],
	[ "$dir/../" . File::Basename::basename($outside) . '/github', qr/write an absolute path without "\." or "\.\."/, 'a path through ..' ],
	[ "$dir/missing", qr/\Q$dir\E\/missing\}: No such file or directory/, 'a missing file' ])
{
	($rc, $out, $err) = $node->psql('postgres', 'SELECT queuebox.configure(' . qb_sql_quote(source_yaml($port, "\${file:$case->[0]}")) . ')');
	isnt($rc, 0, "$case->[2] is refused");
	like($err, qr/sources\.gh\.auth\.secret: file reference .*$case->[1]/, "$case->[2]: the message names the key and the file");
	like($err, qr/Nothing was changed/, "$case->[2]: nothing was changed");
	unlike($err, qr/s3cr3t/, "$case->[2]: the message holds no secret");
}
is($node->safe_psql('postgres', 'SELECT document FROM queuebox.config'), $stored, 'the stored document is the one before');
is(post_signed($port, 'second-s3cr3t'), 202, 'the secret in force is still the file\'s second one');

# the file vanishes: a reload keeps the configuration in force and says why
my $offset = -s $node->logfile;
unlink("$dir/github") or die;
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my $log = qb_wait_log($node, qr/sources\.gh\.auth\.secret: file reference.*No such file/, $offset, timeout => 30);
like($log, qr/sources\.gh\.auth\.secret: file reference \$\{file:\Q$dir\E\/github\}: No such file or directory/,
	'a reload that cannot read the file logs the key path and the file');
is(post_signed($port, 'second-s3cr3t'), 202, 'and the secret in force stays');
my $inbox = qb_inbox_count($node);
is(post_signed($port, 'wrong'), 401, 'a wrong signature is still refused');
is(qb_inbox_count($node), $inbox, 'and stores no row');
unlike(slurp_file($node->logfile), qr/s3cr3t/, 'no secret in the server log');
$node->stop;

# ---------------------------------------------------------------- daemon
# systemd's LoadCredential= hands files over in $CREDENTIALS_DIRECTORY
my $creds = PostgreSQL::Test::Utils::tempdir('credentials');
write_secret("$creds/github", 'daemon-s3cr3t-1');
my $dnode = qbd_node('secrets_daemon');
my $dport = qb_free_port();
my $dyaml = "database: { url: \"" . qbd_url($dnode) . "\" }\n"
  . source_yaml($dport, '${file:${CREDENTIALS_DIRECTORY}/github}');
my $r = qbd_run('--config', qbd_write_conf($dyaml, 'check'), '--check');
isnt($r->[0], 0, '--check without CREDENTIALS_DIRECTORY fails');
like($r->[2], qr/sources\.gh\.auth\.secret: environment variable CREDENTIALS_DIRECTORY is not set/, 'and names the variable');

my $d = qbd_start($dnode, $dyaml, name => 'secrets', env => { CREDENTIALS_DIRECTORY => $creds });
qb_wait_for(sub { $http->get("http://127.0.0.1:$dport/healthz")->{status} == 200 }, 'the daemon\'s ingress listens', timeout => 60);
is(post_signed($dport, 'daemon-s3cr3t-1'), 202, 'daemon: the credential file\'s secret is verified');
write_secret("$creds/github", 'daemon-s3cr3t-2');
my $doff = -s $d->{log};
qbd_signal($d, 'HUP');
qbd_wait_daemon_log($d, qr/configuration reloaded/, $doff);
qb_wait_for(sub { post_signed($dport, 'daemon-s3cr3t-2') == 202 }, 'daemon: after SIGHUP the new secret is verified', timeout => 30);
is(post_signed($dport, 'daemon-s3cr3t-1'), 401, 'daemon: the old secret is refused');

unlink("$creds/github") or die;
$doff = -s $d->{log};
qbd_signal($d, 'HUP');
my $dlog = qbd_wait_daemon_log($d, qr/configuration not reloaded/, $doff);
like($dlog, qr/configuration not reloaded, the running one stays: .*sources\.gh\.auth\.secret: file reference .*github\}: No such file or directory/,
	'daemon: a vanished file is logged with the key path, and the running configuration stays');
is(post_signed($dport, 'daemon-s3cr3t-2'), 202, 'daemon: the secret in force stays');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
unlike(qbd_log($d), qr/s3cr3t/, 'no secret in the daemon\'s log');

done_testing();
