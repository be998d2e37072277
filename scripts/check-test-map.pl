#!/usr/bin/perl
# check-test-map.pl: test/README.md's map of tests stays true (issue 36, part 7).
#
#   scripts/check-test-map.pl      (from anywhere; scripts/test.sh runs it first)
#
# Fails, naming the file and what to do, when
#   - a test file exists that no row of the map names (the kinds: the globs
#     of @KINDS below), or a doc page that no row names;
#   - the map names a file that does not exist;
#   - a TAP file sits outside a group folder (test/t/NNN_x.pl: the Makefile
#     runs test/t/*/*.pl only), two TAP files share an id NNN, or a group
#     folder is missing from the README's table of groups or is not named
#     in lower-case letters.
#
# The map is the tables under "## The map": a row per feature, one column
# per kind; each `backticked` name in a cell is a file of the column's kind,
# written as the header of that column says (README.md: "Reading the map").
use strict;
use warnings;
use File::Basename qw(dirname);
use Cwd qw(abs_path);

my $root = abs_path(dirname(abs_path($0)) . '/..');
chdir $root or die "$root: $!";

# a column's kind -> how a name in it becomes a path, and the files it must cover
my %COLUMN = (
	docs       => [ sub { $_[0] },                           'docs/*.md docs/design/*.md' ],
	unit       => [ sub { "test/unit/$_[0]" },               'test/unit/test_*.c' ],
	pg_regress => [ sub { "test/sql/$_[0].sql" },            'test/sql/*.sql' ],
	isolation  => [ sub { "test/isolation/specs/$_[0].spec" }, 'test/isolation/specs/*.spec' ],
	TAP        => [ sub { "test/t/$_[0]" },                  'test/t/*/*.pl' ],
	other      => [ sub { $_[0] },
		'test/browser/*.test.js test/fuzz/fuzz_*.c test/store/*.c clients/c/test/test_*.c '
		  . 'clients/ts/test/*.test.js clients/go/*_test.go clients/dotnet/test/*/*Tests.cs' ],
);

my @errors;
open(my $fh, '<', 'test/README.md') or die "test/README.md: $!";
my $text = do { local $/; <$fh> };
my ($map) = $text =~ /^## The map\n(.*?)(?=^## |\z)/ms
  or die "test/README.md: no \"## The map\" section\n";

# each table of the map: its header row names the columns' kinds
my %named;
my @kinds;
for my $line (split /\n/, $map)
{
	if ($line !~ /^\|/) { @kinds = (); next; }
	next if $line =~ /^\|[\s|:-]+\|$/;    # the separator row
	my @cells = split /\|/, substr($line, 1);
	if (!@kinds)
	{
		@kinds = map { my ($k) = /^\s*(\w+)/; $k // '' } @cells;
		$kinds[0] = 'docs';                  # the feature and its pages
		for my $k (@kinds)
		{
			push @errors, "test/README.md: the map's column \"$k\" is none of: " . join(', ', sort keys %COLUMN)
			  unless $COLUMN{$k};
		}
		next;
	}
	for my $i (0 .. $#cells)
	{
		my $col = $COLUMN{ $kinds[$i] // '' } or next;
		for my $name ($cells[$i] =~ /`([^`]+)`/g)
		{
			next if $kinds[$i] eq 'docs' && $name !~ /\.md$/;
			my $path = $col->[0]->($name);
			$named{$path} = 1;
			push @errors, "test/README.md names `$name` ($path), which does not exist: fix the map" unless -e $path;
		}
	}
}

for my $kind (sort keys %COLUMN)
{
	for my $path (map { glob } split ' ', $COLUMN{$kind}[1])
	{
		my $what = $kind eq 'docs' ? 'a doc page' : 'a test';
		push @errors, "$path is $what no row of test/README.md's map names: add it to its feature's row"
		  unless $named{$path};
	}
}

# the TAP layout: groups, ids
push @errors, "$_ is outside a group folder: make installcheck runs test/t/<group>/*.pl only; git mv it into one"
  for glob('test/t/*.pl');
my %id;
for my $path (glob('test/t/*/*.pl'))
{
	my ($n) = $path =~ m{/(\d{3})_[^/]+\.pl$};
	if (!defined $n) { push @errors, "$path: a TAP file is named NNN_name.pl (NNN: the next free id)"; next; }
	push @errors, "$path and $id{$n} share the id $n: give one of them the next free id" if $id{$n};
	$id{$n} = $path;
}
for my $group (map { m{^test/t/(.*)} } grep { -d } glob('test/t/*'))
{
	push @errors, "test/t/$group/ is missing from test/README.md's table of groups: add a row for it"
	  unless $text =~ /^\| `\Q$group\E\/`/m;
	push @errors, "test/t/$group/: a group's name is lower-case letters (scripts/test.sh finds a failed file's log by it)"
	  unless $group =~ /^[a-z]+$/;
}

if (@errors)
{
	print STDERR "check-test-map: $_\n" for @errors;
	exit 1;
}
printf "check-test-map: test/README.md names all %d test files and doc pages; TAP ids unique\n", scalar keys %named;
