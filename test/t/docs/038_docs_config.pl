# 038_docs_config.pl
#   Every configuration document the docs show (each ```yaml block of
#   docs/*.md and README.md) passes queuebox.validate(): a doc whose example
#   does not validate is a bug.  A block fenced ```yaml fragment is a part
#   of a document (one key of a source, say) and is not checked alone.  A
#   block fenced ```yaml invalid shows a mistake: validate() must refuse it.
#   The ${NAME} variables the examples use are set for the server, as a reader
#   would set them (a number where the example puts one in a number).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $root = "$FindBin::RealBin/../../..";
my (@blocks, @invalid, $fragments);
for my $file (sort(glob("$root/docs/*.md")), "$root/README.md")
{
	my $text = slurp_file($file);
	(my $name = $file) =~ s{^\Q$root\E/}{};
	while ($text =~ /^```yaml( fragment| invalid)?\n(.*?)^```$/msg)
	{
		my ($kind, $yaml) = ($1 // '', $2);
		my $line = 1 + (() = substr($text, 0, $-[0]) =~ /\n/g);
		if ($kind eq ' fragment') { $fragments++; next; }
		push @{ $kind eq ' invalid' ? \@invalid : \@blocks }, { where => "$name:$line", yaml => $yaml };
	}
}
cmp_ok(scalar(@blocks), '>=', 20, scalar(@blocks) . " documents in the docs ($fragments fragments left out)");

# what a reader sets: a number, a URL, a standard-webhooks secret where the
# example needs one; any other text elsewhere
my $whsec = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
my %values = (QB_BATCH => 100, QUEUEBOX_DB_URL => 'postgres://queuebox@db.example.internal:5432/app',
	BILLING_WEBHOOK_SECRET => $whsec, PARTNER_SECRET_NEW => $whsec, PARTNER_SECRET_OLD => $whsec);
my %vars = map { $_ => 1 } map { $_->{yaml} =~ /\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g } @blocks;
$ENV{$_} = $values{$_} // "doc-example-$_-0123456789abcdef" for keys %vars;
note 'variables set: ' . join(' ', sort keys %vars);

my $node = qb_node('docs', workers => 0, conf => "queuebox.relay_worker = off\n");
for my $b (@blocks)
{
	my ($rc, $out, $err) = $node->psql('postgres', 'SELECT queuebox.validate(' . qb_sql_quote($b->{yaml}) . ')');
	is($rc, 0, "$b->{where}: the example validates") or diag $err;
	like($out, qr/^valid: /, "$b->{where}: $out") if $rc == 0;
}
for my $b (@invalid)
{
	my ($rc, $out, $err) = $node->psql('postgres', 'SELECT queuebox.validate(' . qb_sql_quote($b->{yaml}) . ')');
	isnt($rc, 0, "$b->{where}: the example of a mistake is refused") or diag $out;
	note "$b->{where}: $err";
}
$node->stop;
done_testing();
