# 018_signing.pl
#   Signed delivery, checked as receivers check it:
#   - a standard-webhooks destination with two secrets (a rotation) delivers
#     rows whose every request verifies under each secret alone with the
#     spec's JavaScript library (npm standardwebhooks, through
#     test/node/verify_standard_webhooks.js), and fails with a tampered
#     body; the body signed is the body sent, after the destination's
#     transform;
#   - an hmac-sha256 destination's header is "sha256=" and what
#     `openssl dgst -sha256 -hmac` computes over the body received, under
#     the secret a QUEUEBOX_ override supplies;
#   - configure() refuses a signing: that cannot sign, without echoing the
#     secret.
use strict;
use warnings;

use Encode qw(encode);
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $nodedir = qb_npm_dir('test/node');
my $sink = qb_sink_start(name => 'signing');

# the hmac-sha256 secret comes from an override, in the server's environment
my $gh_secret = 'gh-018-override-secret';
$ENV{QUEUEBOX_DESTINATIONS_GH_SIGNING_SECRET} = $gh_secret;
my $node = qb_node('signing');
delete $ENV{QUEUEBOX_DESTINATIONS_GH_SIGNING_SECRET};

my $new = 'whsec_' . encode_base64('queuebox-018-the-new-signing-key', '');
my $old = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';    # the spec's example secret

qb_configure(
	$node,
	qb_config_yaml(
		destinations => {
			hooks => {
				type => 'http',
				baseUrl => $sink->{url},
				path => '/hooks',
				transform => '. + {signedBy: "queuebox"}',
				signing => { type => 'standard-webhooks', secrets => [ $new, $old ] },
			},
			gh => {
				type => 'http',
				baseUrl => $sink->{url},
				path => '/gh',
				signing => {
					type => 'hmac-sha256',
					header => 'X-Hub-Signature-256',
					prefix => 'sha256=',
					secret => 'in-the-document-and-overridden',
				},
			},
		},
		routes => [
			{ topicPattern => 'signed.**', destination => 'hooks' },
			{ topicPattern => 'gh.**', destination => 'gh' },
		]));

$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers)
	SELECT 'signed.created', 'k-' || i,
		   jsonb_build_object('n', i, 'note', 'caf' || chr(233) || ' "quoted"'),
		   jsonb_build_object('webhook-signature', 'v1,forged-by-the-row')
	FROM generate_series(1, 5) i;
	INSERT INTO queuebox.outbox (topic, payload)
	SELECT 'gh.push', jsonb_build_object('ref', 'refs/heads/main', 'n', i)
	FROM generate_series(1, 3) i;
});
qb_wait_query($node,
	"SELECT count(*) FILTER (WHERE state = 'sent') FROM queuebox.outbox",
	'8', 'the eight signed rows are sent', timeout => 60);

# ---- standard-webhooks, as the spec's library verifies it
my $reqs = qb_sink_requests($sink);
my @hooks = grep { $_->{path} eq '/hooks' } @$reqs;
is(scalar @hooks, 5, 'five requests to the standard-webhooks destination');
for my $r (@hooks)
{
	is($r->{headers}{'webhook-id'}, $r->{mid}, "$r->{mid}: webhook-id is the message id (X-Message-Id)");
	like($r->{headers}{'webhook-timestamp'}, qr/^\d{10}$/, "$r->{mid}: webhook-timestamp in Unix seconds");
	like($r->{headers}{'webhook-signature'}, qr{^v1,[A-Za-z0-9+/]{43}= v1,[A-Za-z0-9+/]{43}=$},
		"$r->{mid}: two v1 signatures, one per secret (the row's forged one is not sent)");
	like($r->{body}, qr/"signedBy":\s*"queuebox"/, "$r->{mid}: the body sent is the transform's output");
}

my ($out, $err) = run_command(
	[ 'node', "$nodedir/verify_standard_webhooks.js", $sink->{log}, '/hooks', $new, $old ]);
note "verifier: $out $err";
my $res = eval { JSON::PP::decode_json($out) } // {};
is($res->{requests}, 5, 'the verifier read the five requests');
is_deeply($res->{verified}, [ 5, 5 ],
	'every request verifies with new Webhook(secret).verify(body, headers), under each secret alone');
is_deeply($res->{tampered_rejected}, [ 5, 5 ], 'a tampered body fails verification under each secret');
is_deeply($res->{errors}, [], 'the verifier reports no error');

($out, $err) = run_command(
	[ 'node', "$nodedir/verify_standard_webhooks.js", $sink->{log}, '/hooks',
		'whsec_' . encode_base64('a-secret-nobody-configured', '') ]);
like($out, qr/"verified":\[0\]/, 'under a secret QueueBox does not hold, no request verifies');

# ---- hmac-sha256, against the openssl command line
my @gh = grep { $_->{path} eq '/gh' } @$reqs;
is(scalar @gh, 3, 'three requests to the hmac-sha256 destination');
for my $r (@gh)
{
	my $file = "$PostgreSQL::Test::Utils::tmp_check/body_$r->{mid}";
	open(my $fh, '>:raw', $file) or die "$file: $!";
	print $fh encode('UTF-8', $r->{body});
	close $fh;
	my ($hex) = run_command([ 'openssl', 'dgst', '-sha256', '-hmac', $gh_secret, '-r', $file ]);
	$hex =~ s/\s.*//s;
	like($hex, qr/^[0-9a-f]{64}$/, "$r->{mid}: openssl computed an HMAC");
	is($r->{headers}{'x-hub-signature-256'}, "sha256=$hex",
		"$r->{mid}: X-Hub-Signature-256 is sha256= and the HMAC of the body under the override's secret");
	ok(!exists $r->{headers}{'webhook-signature'}, "$r->{mid}: no standard-webhooks header");
}

# ---- configure() refuses what cannot sign, never echoing a secret
my ($rc, $stdout, $stderr) = $node->psql('postgres',
	'SELECT queuebox.configure(' . qb_sql_quote(qb_config_yaml(
		destinations => {
			hooks => {
				type => 'http',
				baseUrl => $sink->{url},
				signing => { type => 'standard-webhooks', secret => 'whsec_!!TOP-SECRET!!' },
			}
		})) . ')');
isnt($rc, 0, 'configure() refuses a standard-webhooks secret that is not base64');
like($stderr, qr/destinations\.hooks\.signing\.secret: a standard-webhooks secret is whsec_ followed by base64/,
	'the message names the key');
unlike($stderr, qr/TOP-SECRET/, 'the message does not echo the secret');

($rc, $stdout, $stderr) = $node->psql('postgres',
	'SELECT queuebox.configure(' . qb_sql_quote(qb_config_yaml(
		destinations => {
			bus => {
				type => 'nats',
				url => 'nats://127.0.0.1:4222',
				signing => { type => 'hmac-sha256', header => 'X-Sig', secret => 's' },
			}
		})) . ')');
like($stderr, qr/destinations\.bus\.signing: signing is for http destinations only/,
	'signing on a nats destination is refused');

qb_sink_stop($sink);
$node->stop;
done_testing();
