#!/usr/bin/perl
# bench/chaos/check.pl: the chaos run's independent checker (issue 38).
#
#   bench/chaos/check.pl DIR
#
# Reads only files of DIR, never the database:
#   writer-*.jsonl    what the writers tried and learned, one line each:
#                     {"ev":"try","tx":T,"t":S,"rows":[{"key":K,"seq":N,"poison":0|1},..]}
#                     (before the transaction), then {"ev":"commit","tx":T,"t":S}
#                     (COMMIT answered) or {"ev":"unknown","tx":T,"t":S,"why":..}
#                     (no answer: the outcome is learned afterwards)
#   committed.txt     the business rows (table chaos_tx) read once the run
#                     was over, one transaction token a line: how an unknown
#                     outcome is learned (and a check that no COMMIT that was
#                     answered is missing); for webhooks, the idempotency
#                     keys the inbox stored (a webhook is a transaction of one
#                     row, its 2xx the answered COMMIT): each must be there
#                     once
#   receiver-*.jsonl  the receivers' records (test/sink/qb_sink --log): one
#                     line per request, t_us when its body was read, status,
#                     the X-Message-Id header and the body (the row's
#                     payload: {"tx":T,"key":K,"seq":N,...})
#   faults.jsonl      what the nemesis did: {"fault":F,"start":S,"end":S,
#                     "receiver":"receiver-x receiver-n"} (the receivers
#                     whose rows it is about, by file name; none: all)
#   dead.jsonl        optional: the rows the system itself declares dead
#                     ({"key":K,"seq":N}), read after the run
#   meta.json         the run's settings (slack_before_s, slack_after_s)
#
# Definitions (bench/chaos/README.md says the same):
#   committed   a row of a transaction whose COMMIT was answered, or whose
#               token is in committed.txt
#   stored      a request the receiver answered 2xx (a cut answer too: the
#               receiver took it, the sender did not hear so; the sink logs
#               no request whose client left before its answer); a row's
#               first store is the earliest t_us (then log order)
#   lost        a committed row that is not poison and was never stored
#   reordered   within a key, a committed row first stored before an
#               earlier (lower seq) committed, stored row of the key was
#               first stored.  A row stored again after later rows of its
#               key is a duplicate, not a reordering, when its first store
#               was in order
#   duplicate   each store of a row after its first; it is explained by a
#               fault when the row's first store and the duplicate both lie
#               in [start - slack_before, end + slack_after] of one fault
#               about its receiver (the row was in flight at the fault, and
#               sent again once it was over); otherwise it is unexplained, a
#               failure
#   after a later row
#               a duplicate stored after a later row of its key was first
#               stored; and a row whose last store came after the last store
#               of a later row of its key (a receiver keeping the last
#               version it got ends with the older row).  Counted and
#               shown, not failures: at least once allows them
#   phantom     a stored row whose transaction did not commit (or that no
#               writer tried): a failure
#   poison      a row the writer asked to fail (its receiver answers 422,
#               max_attempts 2): it must never be stored, and only poison
#               rows may be dead
#   stall       a gap of at least 0.25 s between two 2xx answers (the
#               writers never pause that long), the latest fault's that
#               began before it or up to 0.25 s after its first moment, if
#               it begins at most 5 s after that fault's end; per fault, the
#               longest
#   resume      per fault, the time from its end to the end of the last
#               such stall (the first 2xx after it), 0 when deliveries went
#               on through the end; without a stall, to the first 2xx at or
#               after the end
# Exit 0 when nothing failed; 1 with a FAIL line per finding; 2 on bad input.

use strict;
use warnings;

use File::Glob qw(:bsd_glob);
use JSON::PP;

my $dir = shift @ARGV or die "usage: check.pl DIR\n";
my $json = JSON::PP->new;

sub read_jsonl
{
	my ($path) = @_;
	my @out;
	open(my $fh, '<', $path) or die "check.pl: $path: $!\n";
	while (my $l = <$fh>)
	{
		next unless $l =~ /\n\z/;    # a line cut by a crash of its writer
		push @out, $json->decode($l);
	}
	close $fh;
	return @out;
}

my $meta = -e "$dir/meta.json" ? $json->decode(do { local (@ARGV, $/) = ("$dir/meta.json"); <> }) : {};
my $slack_before = $meta->{slack_before_s} // 5;
my $slack_after = $meta->{slack_after_s} // 15;

# ---------------------------------------------------------------- the writers

my (%tx, %row);    # tx => { rows, outcome }; "key/seq" => { key, seq, tx, poison }
my @wfiles = glob("$dir/writer-*.jsonl");
die "check.pl: no writer-*.jsonl in $dir\n" unless @wfiles;
for my $f (@wfiles)
{
	for my $e (read_jsonl($f))
	{
		if ($e->{ev} eq 'try')
		{
			$tx{ $e->{tx} } = { rows => $e->{rows}, outcome => 'unknown', t => $e->{t} };
			for my $r (@{ $e->{rows} })
			{
				$row{"$r->{key}/$r->{seq}"} = { %$r, tx => $e->{tx} };
			}
		}
		elsif ($e->{ev} eq 'commit' || $e->{ev} eq 'unknown')
		{
			die "check.pl: $f: $e->{ev} of an untried transaction $e->{tx}\n" unless $tx{ $e->{tx} };
			$tx{ $e->{tx} }{outcome} = $e->{ev};
		}
	}
}
my %in_db;
if (-e "$dir/committed.txt")
{
	open(my $fh, '<', "$dir/committed.txt") or die $!;
	while (my $l = <$fh>)
	{
		chomp $l;
		$in_db{$l}++ if $l ne '';
	}
}
else
{
	die "check.pl: no committed.txt in $dir (the business rows read after the run)\n";
}

my @fail;
my %n = (tx => scalar(keys %tx), tx_answered => 0, tx_unknown => 0, tx_unknown_committed => 0);
for my $t (sort keys %tx)
{
	my $x = $tx{$t};
	if ($x->{outcome} eq 'commit')
	{
		$n{tx_answered}++;
		push @fail, "committed transaction $t (its COMMIT was answered) has no business row after the run"
		  unless $in_db{$t};
		$x->{committed} = 1;
	}
	else
	{
		$n{tx_unknown}++;
		$x->{committed} = $in_db{$t} ? 1 : 0;
		$n{tx_unknown_committed}++ if $x->{committed};
	}
}
for my $t (sort keys %in_db)
{
	push @fail, "business row $t has no transaction in the writers' logs" unless $tx{$t};
	push @fail, "business row $t is stored $in_db{$t} times" if $in_db{$t} > 1;
}

# ---------------------------------------------------------------- the receivers

my @rfiles = glob("$dir/receiver-*.jsonl");
die "check.pl: no receiver-*.jsonl in $dir\n" unless @rfiles;
my @req;
my $idx = 0;
for my $f (sort @rfiles)
{
	my ($rtag) = $f =~ m{(receiver-[^/]*)\.jsonl$};
	for my $e (read_jsonl($f))
	{
		my $doc = eval { $json->decode($e->{body}) };
		next unless ref $doc eq 'HASH' && defined $doc->{key} && defined $doc->{seq};
		push @req, { t => $e->{t_us} / 1e6, idx => $idx++, status => $e->{status}, cut => $e->{cut} ? 1 : 0, rx => $rtag,
			id => "$doc->{key}/$doc->{seq}", mid => $e->{headers}{'x-message-id'} // '' };
	}
}
@req = sort { $a->{t} <=> $b->{t} || $a->{idx} <=> $b->{idx} } @req;

my (%stores, %mid_of, %rx_of);
my %st = (requests => scalar(@req), stored => 0, failed_answers => 0, cut => 0);
for my $q (@req)
{
	my $r = $row{ $q->{id} };
	if (!$r)
	{
		push @fail, "the receiver got row $q->{id}, which no writer tried";
		next;
	}
	if (defined $mid_of{ $q->{id} } && $mid_of{ $q->{id} } ne $q->{mid})
	{
		push @fail, "row $q->{id} came with two message ids: $mid_of{ $q->{id} } and $q->{mid}";
	}
	$mid_of{ $q->{id} } //= $q->{mid};
	if ($q->{status} >= 200 && $q->{status} < 300)
	{
		$st{stored}++;
		$st{cut}++ if $q->{cut};
		push @{ $stores{ $q->{id} } }, $q->{t};
		$rx_of{ $q->{id} } //= $q->{rx};
	}
	else
	{
		$st{failed_answers}++;
	}
}

# ---------------------------------------------------------------- lost, phantom, poison

my %committed_rows;
my ($lost, $phantom) = (0, 0);
my %by_key;
for my $id (keys %row)
{
	my $r = $row{$id};
	my $c = $tx{ $r->{tx} }{committed};
	if (!$c)
	{
		if ($stores{$id})
		{
			$phantom++;
			push @fail, "phantom: row $id of transaction $r->{tx}, which did not commit, was delivered";
		}
		next;
	}
	$committed_rows{$id} = 1;
	if ($r->{poison})
	{
		push @fail, "poison row $id was delivered (its receiver answered 2xx)" if $stores{$id};
		next;
	}
	if (!$stores{$id})
	{
		$lost++;
		push @fail, "lost: committed row $id (transaction $r->{tx}, "
		  . ($tx{ $r->{tx} }{outcome} eq 'commit' ? 'COMMIT answered' : 'outcome learned afterwards')
		  . ') was never delivered';
		next;
	}
	push @{ $by_key{ $r->{key} } }, $r->{seq};
}
my ($poison_n, $dead_n) = (0, 0);
$poison_n = grep { $row{$_}{poison} } keys %committed_rows;
if (-e "$dir/dead.jsonl")
{
	for my $d (read_jsonl("$dir/dead.jsonl"))
	{
		$dead_n++;
		my $id = "$d->{key}/$d->{seq}";
		push @fail, "dead letter $id was not asked for (not a poison row)" unless $row{$id} && $row{$id}{poison};
	}
}

# ---------------------------------------------------------------- order

my $reordered = 0;
for my $k (sort keys %by_key)
{
	my @seqs = sort { $a <=> $b } @{ $by_key{$k} };
	my ($prev, $prev_t);
	for my $s (@seqs)
	{
		my $t = $stores{"$k/$s"}[0];
		if (defined $prev_t && $t < $prev_t)
		{
			$reordered++;
			push @fail, sprintf('reordered: key %s: row %d first delivered at %.6f, before row %d (first at %.6f)',
				$k, $s, $t, $prev, $prev_t);
		}
		($prev, $prev_t) = ($s, $t) if !defined $prev_t || $t >= $prev_t;
	}
}

# ---------------------------------------------------------------- faults

my @faults = -e "$dir/faults.jsonl" ? read_jsonl("$dir/faults.jsonl") : ();
my $GAP = 0.25;    # seconds without a 2xx that make a stall (the writers never pause so long)
@faults = sort { $a->{start} <=> $b->{start} } @faults;
my %rx_known = map { m{(receiver-[^/]*)\.jsonl$} ? ($1 => 1) : () } @rfiles;
for my $f (@faults)
{
	my @named = split ' ', $f->{receiver} // '';
	my @unknown = grep { !$rx_known{$_} } @named;
	push @fail, "the $f->{fault} fault at $f->{start} names a receiver with no record: @unknown" if @unknown;
	$f->{stall} = 0;
	$f->{rxs} = @named ? [ grep { $rx_known{$_} } @named ] : [''];
}
# about($f, $rx): the fault is about that receiver ('': all of them)
sub about { my ($f, $rx) = @_; return scalar grep { $_ eq $rx } @{ $f->{rxs} }; }
# the 2xx times of each receiver, and of all ('')
my %ok_times;
for my $q (grep { $_->{status} >= 200 && $_->{status} < 300 } @req)
{
	push @{ $ok_times{''} }, $q->{t};
	push @{ $ok_times{ $q->{rx} } }, $q->{t};
}
# a fault is about the receivers it names ("receiver": their files' names
# without .jsonl, space-separated), else about all.  Each stall of a
# receiver is the latest fault about it that began before the stall (or
# within $GAP after its start: the fault stopped the 2xx that were due), if
# the stall begins at most 5 s after that fault's end; a fault about
# several receivers resumes when the last of them does
for my $rx (keys %ok_times)
{
	my @f = grep { about($_, $rx) } @faults;
	next unless @f;
	my $ok = $ok_times{$rx};
	my $k = -1;
	for my $i (0 .. $#$ok - 1)
	{
		my ($p, $q) = @$ok[ $i, $i + 1 ];
		next if $q - $p < $GAP;
		$k++ while $k < $#f && $f[ $k + 1 ]{start} <= $p + $GAP;
		next if $k < 0 || $p > $f[$k]{end} + 5;
		$f[$k]{resume_at}{$rx} = $q;
		$f[$k]{stall} = $q - $p if $q - $p > $f[$k]{stall};
	}
}
# first_ok_after($rx, $t): the receiver's first 2xx at or after $t
sub first_ok_after
{
	my ($rx, $t) = @_;
	my $ok = $ok_times{$rx} // [];
	my ($lo, $hi) = (0, scalar @$ok);
	while ($lo < $hi)
	{
		my $mid = int(($lo + $hi) / 2);
		if ($ok->[$mid] < $t) { $lo = $mid + 1 } else { $hi = $mid }
	}
	return $lo < @$ok ? $ok->[$lo] : undef;
}
for my $f (@faults)
{
	# per receiver: the end of its last stall, or without one its first 2xx
	# at or after the end; the fault resumes when its last receiver does
	my ($resume_at, $never);
	# (a receiver that never answered 2xx has nothing to resume; a lost row says more)
	for my $rx (grep { $ok_times{$_} } @{ $f->{rxs} })
	{
		my $t = $f->{resume_at}{$rx} // first_ok_after($rx, $f->{end});
		$never = 1 unless defined $t;
		$resume_at = $t if defined $t && (!defined $resume_at || $t > $resume_at);
	}
	$resume_at = undef if $never;
	$f->{resume} = defined $resume_at ? ($resume_at > $f->{end} ? $resume_at - $f->{end} : 0) : undef;
	$f->{dups} = 0;
	push @fail, "no delivery after the $f->{fault} fault that ended at $f->{end}" unless defined $f->{resume};
}
# the latest first store of a later row of each key, by seq: a duplicate
# after it came after a later row of its key (at least once, not a
# reordering: counted apart, to look at)
my %later_first;    # "key/seq" => the earliest first store of a row of the key with a higher seq
for my $k (keys %by_key)
{
	my @seqs = sort { $b <=> $a } @{ $by_key{$k} };
	my $min;
	for my $sq (@seqs)
	{
		$later_first{"$k/$sq"} = $min;
		my $t = $stores{"$k/$sq"}[0];
		$min = $t if !defined $min || $t < $min;
	}
}
# rows whose last store came after the last store of a later row of their
# key: a receiver that keeps the last version it was sent ends with an
# older row (at least once allows it; counted apart, to look at)
my ($stale, @stale) = (0);
for my $k (keys %by_key)
{
	my @seqs = sort { $b <=> $a } @{ $by_key{$k} };
	my ($max, $max_seq);
	for my $sq (@seqs)
	{
		my $t = $stores{"$k/$sq"}[-1];
		if (defined $max && $t > $max)
		{
			$stale++;
			push @stale, sprintf('%s/%d (last %.6f, after %s/%d last %.6f)', $k, $sq, $t, $k, $max_seq, $max) if @stale < 5;
		}
		($max, $max_seq) = ($t, $sq) if !defined $max || $t < $max;
	}
}
my ($dups, $unexplained, $after_later) = (0, 0, 0);
my @after_later;
for my $id (sort keys %stores)
{
	my @t = @{ $stores{$id} };
	next unless @t > 1;
	for my $td (@t[1 .. $#t])
	{
		$dups++;
		if (defined $later_first{$id} && $later_first{$id} < $td)
		{
			$after_later++;
			push @after_later, sprintf('%s (first %.6f, again %.6f)', $id, $t[0], $td) if @after_later < 5;
		}
		my ($by) = grep {
			about($_, '') || about($_, $rx_of{$id})
		} grep {
			my $lo = $_->{start} - $slack_before;
			my $hi = $_->{end} + $slack_after;
			$t[0] >= $lo && $t[0] <= $hi && $td >= $lo && $td <= $hi && $_->{start} <= $td
		} reverse @faults;
		if ($by)
		{
			$by->{dups}++;
		}
		else
		{
			$unexplained++;
			push @fail, sprintf('unexplained duplicate: row %s first delivered at %.6f, again at %.6f, no fault around both',
				$id, $t[0], $td);
		}
	}
}

# ---------------------------------------------------------------- report

my $ncommitted = scalar keys %committed_rows;
my $delivered = grep { $stores{$_} } keys %committed_rows;
printf "transactions: %d tried, %d COMMIT answered, %d outcome unknown (%d of them committed)\n",
  $n{tx}, $n{tx_answered}, $n{tx_unknown}, $n{tx_unknown_committed};
printf "rows: %d committed over %d keys (%d poison), %d delivered; %d lost, %d reordered, %d phantom\n",
  $ncommitted, scalar(keys %by_key), $poison_n, $delivered, $lost, $reordered, $phantom;
# per writer kind (the key's letters: x the extension, d the daemon, n NATS,
# h the webhooks, in TAP 061): committed rows, delivered, answered COMMITs
my %kind;
for my $id (keys %committed_rows)
{
	my ($k) = $row{$id}{key} =~ /^([A-Za-z]+)/;
	$k //= '?';
	$kind{$k}{rows}++;
	$kind{$k}{delivered}++ if $stores{$id};
}
print 'by key prefix: ' . join('; ', map { "$_ $kind{$_}{rows} committed, " . ($kind{$_}{delivered} // 0) . ' delivered' }
	sort keys %kind) . "\n";
printf "requests: %d (%d stored with 2xx, %d of them cut mid-answer; %d other answers); dead letters %d\n",
  $st{requests}, $st{stored}, $st{cut}, $st{failed_answers}, $dead_n;
printf "duplicates: %d (%d unexplained by a fault; %d sent again after a later row of their key was delivered%s)\n",
  $dups, $unexplained, $after_later, @after_later ? ', e.g. ' . join(', ', @after_later) : '';
printf "last deliveries out of order: %d rows last delivered after a later row of their key was last delivered%s\n",
  $stale, @stale ? ', e.g. ' . join(', ', @stale) : '';
my %by_type;
push @{ $by_type{ $_->{fault} } }, $_ for @faults;
print "faults: " . scalar(@faults) . "\n";
printf "| %-20s | %5s | %-26s | %-26s | %10s |\n", 'fault', 'count', 'resume s (min / med / max)',
  'stall s (min / med / max)', 'duplicates';
printf "|%s|%s|%s|%s|%s|\n", '-' x 22, '-' x 7, '-' x 28, '-' x 28, '-' x 12;
for my $type (sort keys %by_type)
{
	my $spread = sub {
		my @v = sort { $a <=> $b } @_;
		return @v ? sprintf('%.2f / %.2f / %.2f', $v[0], $v[ int($#v / 2) ], $v[-1]) : 'never';
	};
	my $d = 0;
	$d += $_->{dups} for @{ $by_type{$type} };
	printf "| %-20s | %5d | %-26s | %-26s | %10d |\n", $type, scalar @{ $by_type{$type} },
	  $spread->(map { $_->{resume} // () } @{ $by_type{$type} }), $spread->(map { $_->{stall} } @{ $by_type{$type} }), $d;
}
if (@fail)
{
	my $more = @fail > 50 ? @fail - 50 : 0;
	print "FAIL: $_\n" for @fail[0 .. ($more ? 49 : $#fail)];
	print "FAIL: ... and $more more\n" if $more;
	print "verdict: FAIL (" . scalar(@fail) . " findings)\n";
	exit 1;
}
print "verdict: OK (0 lost, 0 reordered, 0 phantom, every duplicate explained by a fault)\n";
exit 0;
