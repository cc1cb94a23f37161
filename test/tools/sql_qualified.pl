#!/usr/bin/perl
#
# sql_qualified.pl: report every name in the extension's SQL that a
# search_path could capture.
#
# Usage: sql_qualified.pl [FILE...]   (default: src/*.c, the install
# script of outbox.control's default_version and the update scripts
# sql/outbox--A--B.sql, from the current directory; a released install
# script is kept as released and not checked).  Prints one
# "file:line: finding" per name and exits 1 if there is any, else 0.
#
# What is checked.  From a C file: every run of adjacent string literals
# (object-like macros made of literals, and function-like ones whose
# arguments are literals, expanded in place) that looks like SQL: it starts
# with SELECT/INSERT/UPDATE/DELETE/WITH/LOCK/TRUNCATE/VALUES or contains
# FROM/WHERE/SET, and is not an argument of errmsg(), elog() and the like.
# psprintf() conversions: "%s." is the extension's (quoted) schema and so a
# qualifier, another "%s" an opaque name, "%d" a number, "%%" a "%".  From a
# .sql file: the whole script, "@extschema@" being the schema, and every
# dollar-quoted body (function bodies) as SQL of its own.  String literals,
# comments and quoted identifiers are set aside first.
#
# The rules, each reported with its line:
#  - an operator token (=, <, <=, >, >=, <>, +, -, *, /, %, ^, ||, ~~, ...)
#    must be written OPERATOR(pg_catalog.op).  Not operators: "*" as in
#    SELECT * / count(*) / o.*, "-" before a numeric constant (the grammar
#    folds it), "=>" (named argument), ":=", and the "=" of an assignment
#    (UPDATE/ON CONFLICT ... SET col =, SET option =, ALTER ... SET (opt =),
#    plpgsql RAISE ... USING opt =, GET DIAGNOSTICS v =);
#  - constructs that look "=" (or "~~", ">=", "<=") up through the
#    search_path behind the user's back: LIKE/ILIKE/SIMILAR TO, IN (...),
#    NOT IN (...), BETWEEN, IS [NOT] DISTINCT FROM, NULLIF(), a simple CASE
#    (CASE x WHEN ...), JOIN ... USING (...), NATURAL JOIN, OVERLAPS;
#  - a function call name( must be schema.name( unless name is a keyword of
#    the grammar that is not looked up by name (COALESCE, GREATEST, LEAST,
#    EXISTS, ARRAY, ROW, CAST, EXTRACT, SUBSTRING, ... see %NOT_CALLS);
#  - a relation after FROM/JOIN/UPDATE/INSERT INTO/DELETE FROM/USING/LOCK/
#    TRUNCATE (and after a comma of a FROM list) must be qualified, unless it
#    names a WITH query of the same statement: under a pinned search_path of
#    "pg_catalog, pg_temp" an unqualified name that is not a catalog's is
#    looked up in pg_temp, which any caller can fill;
#  - OPERATOR() has a single precedence, left to right: an OPERATOR() whose
#    bare operator would bind tighter than the previous one of the same
#    expression (a OPERATOR(pg_catalog.<) b OPERATOR(pg_catalog.-) c) is
#    reported: it needs parentheses to keep its meaning;
#  - pg_catalog.unnest(a, b) is an error (only a bare unnest of several
#    arrays is expanded): ROWS FROM (pg_catalog.unnest(a), ...) instead;
#  - in C files, a cast type (::name, CAST(x AS name)) must be
#    ::pg_catalog.name or ::%s.name.
#
# Cast and column types in the install script.  CREATE EXTENSION runs the
# script with search_path = "<target schema>, pg_temp" (extension.c,
# execute_extension_script(): the target schema, the schemas of required
# extensions other than pg_catalog, then pg_temp), so pg_catalog, not
# listed, is searched first and pg_temp last.  A type name is looked up by
# exact name in path order, with no overload resolution, so a built-in type
# name there always means pg_catalog's: column types, argument types and
# casts of top-level statements and views (bound when they are created) may
# stay unqualified.  Function bodies are bound when they run, under their
# own search_path: so every LANGUAGE sql or plpgsql function of the script
# must pin "SET search_path = pg_catalog, pg_temp" (reported otherwise),
# under which a built-in type name again means pg_catalog's.  Functions and
# operators get no such pass anywhere: overload resolution may prefer a
# better-matching one from a later schema.
#
# SQL_QUALIFIED_DUMP=1 in the environment prints every C text taken as SQL
# (to standard error).
#
# Limits: a heuristic reader, not a parser.  Text assembled at run time
# from pieces that are not literals (a "%s" filled with SQL) is not seen.
#

use strict;
use warnings;

# Names followed by "(" that are not function calls looked up by name.
my %NOT_CALLS = map { $_ => 1 } qw(
  ALL AND ANY ARRAY AS BETWEEN BY CALL CASE CAST CHECK COALESCE CONFLICT
  CONSTRAINT CUBE DEFAULT DISTINCT DO ELSE ELSIF END ENUM EXCEPT EXECUTE
  EXISTS EXTRACT FILTER FOR FROM GREATEST GROUPING GROUPS HAVING IF IN INTO
  INTERSECT IS JOIN KEY LATERAL LEAST LIKE LIMIT NOT NULLIF OFFSET ON
  OPERATOR OR OVER OVERLAY PARTITION PERFORM POSITION QUERY RAISE RANGE
  RETURN RETURNING RETURNS ROLLUP ROW ROWS SELECT SET SETS SOME SUBSTRING
  TABLE THEN TRIM UNION UNIQUE USING VALUES WHEN WHERE WHILE WITH
  WITHIN);

# Keywords after which a name( is an expression (a call), not an alias or
# a column list.
my %EXPR_KW = map { $_ => 1 } qw(
  ALL AND ANY BETWEEN BY CASE DEFAULT DISTINCT DO ELSE ELSIF EXECUTE EXISTS
  FROM HAVING IF IN IS JOIN LATERAL LIKE LIMIT NOT OFFSET ON OR PERFORM QUERY
  RAISE RETURN RETURNING SELECT SET SOME THEN USING VALUES WHEN WHERE WHILE
  WITH CALL CHECK ORDER GROUP);

# Words that end a FROM list or a SET list at their own depth.
my %CLAUSE_END = map { $_ => 1 } qw(
  WHERE GROUP HAVING ORDER LIMIT OFFSET UNION INTERSECT EXCEPT RETURNING FOR
  WINDOW INTO ON SET FROM AS LANGUAGE);

# Words that end an operand chain (for check_precedence).
my %BOUNDARY = map { $_ => 1 } qw(AND OR NOT THEN ELSE END WHEN CASE IS AS);

my %RAISE_OPTS = map { $_ => 1 }
  qw(ERRCODE MESSAGE DETAIL HINT COLUMN CONSTRAINT DATATYPE TABLE SCHEMA);

# Calls whose string arguments are messages, not SQL.
my $MESSAGE_CALLS = qr/^(?:errmsg\w*|errdetail\w*|errhint\w*|errcontext\w*|
  elog|ereport|GUC_check_err\w+|DefineCustom\w+Variable|
  pgstat_report_activity|set_problem|strcmp|strncmp|strstr)$/x;

my @findings;

# Record one finding at a line.
sub report
{
	my ($file, $line, $msg) = @_;
	push @findings, "$file:$line: $msg";
	return;
}

# ---------------------------------------------------------------- C side

# Tokenize C source: [type, value, line]; #define bodies go to %$macros.
sub c_tokens
{
	my ($src, $line0, $macros) = @_;
	my @t;
	my $line = $line0;
	my $bol = 1;
	pos($src) = 0;
	while (pos($src) < length $src)
	{
		if ($src =~ /\G([ \t\f\r]+)/gc) { next; }
		if ($src =~ /\G\n/gc) { $line++; $bol = 1; next; }
		if ($src =~ m{\G/\*(.*?)\*/}gcs) { $line += ($1 =~ tr/\n//); next; }
		if ($src =~ m{\G//[^\n]*}gc) { next; }
		if ($bol && $src =~ /\G#((?:[^\n\\]|\\.)*)/gcs)
		{
			my $dir = $1;
			my $start = $line;
			$line += ($dir =~ tr/\n//);
			if ($macros && $dir =~ /^\s*define\s+(\w+)(\(([^)]*)\))?(.*)$/s)
			{
				my ($name, $params, $body) = ($1, $3, $4);
				$body =~ s/\\\n/ \n/g;
				my @p = defined $params ? map { s/^\s+|\s+$//gr } split /,/, $params : ();
				$macros->{$name} = {
					params => defined $params ? \@p : undef,
					body => [ c_tokens($body, $start, undef) ]};
			}
			next;
		}
		$bol = 0;
		if ($src =~ /\G(?:u8|u|U|L)?"((?:[^"\\\n]|\\.)*)"/gc)
		{
			my $v = $1;
			$v =~ s/\\(["'\\?])/$1/g;
			$v =~ s/\\n/\n/g;
			$v =~ s/\\t/\t/g;
			push @t, [ 'str', $v, $line ];
			next;
		}
		if ($src =~ /\G'(?:[^'\\\n]|\\.)*'/gc) { push @t, [ 'chr', '', $line ]; next; }
		if ($src =~ /\G([A-Za-z_]\w*)/gc) { push @t, [ 'id', $1, $line ]; next; }
		if ($src =~ /\G(\.?\d(?:[\w.]|[eEpP][+-])*)/gc) { push @t, [ 'num', $1, $line ]; next; }
		if ($src =~ /\G(->|\+\+|--|<<=?|>>=?|[<>=!]=|&&|\|\||##|[-+*\/%&|^~!<>=?:;,.()\[\]{}#])/gc)
		{
			push @t, [ 'p', $1, $line ];
			next;
		}
		$src =~ /\G./gcs;
	}
	return @t;
}

# Expand the string-valued macro at $t->[$i], if it is one: ([pieces], next i).
sub expand_macro
{
	my ($t, $i, $macros, $line) = @_;
	my $m = $macros->{ $t->[$i][1] };
	return unless $m;
	my %args;
	my $next = $i + 1;
	if ($m->{params})
	{
		return unless $next < @$t && $t->[$next][1] eq '(';
		my ($depth, @cur, @all) = (0);
		for ($next++; $next < @$t; $next++)
		{
			my $v = $t->[$next];
			if ($v->[0] eq 'p' && $v->[1] eq '(') { $depth++; }
			if ($v->[0] eq 'p' && $v->[1] eq ')' && $depth-- == 0) { push @all, [@cur]; last; }
			if ($v->[0] eq 'p' && $v->[1] eq ',' && $depth == 0) { push @all, [@cur]; @cur = (); next; }
			push @cur, $v;
		}
		$next++;
		@args{ @{ $m->{params} } } = @all;
	}
	my @pieces;
	for my $b (@{ $m->{body} })
	{
		my @toks = ($b->[0] eq 'id' && $args{ $b->[1] }) ? @{ $args{ $b->[1] } } : ($b);
		for my $x (@toks)
		{
			if ($x->[0] eq 'str') { push @pieces, [ $x->[1], $line ]; next; }
			if ($x->[0] eq 'id' && $macros->{ $x->[1] })
			{
				my ($sub) = expand_macro([$x], 0, $macros, $line);
				return unless $sub;
				push @pieces, @$sub;
				next;
			}
			return;
		}
	}
	return unless @pieces;
	return (\@pieces, $next);
}

# The name of the call whose argument list holds token $i, if any.
sub enclosing_call
{
	my ($t, $i) = @_;
	my $depth = 0;
	for (my $j = $i - 1; $j >= 0; $j--)
	{
		my $v = $t->[$j];
		next unless $v->[0] eq 'p';
		if ($v->[1] eq ')') { $depth++; }
		elsif ($v->[1] eq '(')
		{
			return ($j > 0 && $t->[ $j - 1 ][0] eq 'id') ? $t->[ $j - 1 ][1] : '' if $depth == 0;
			$depth--;
		}
		elsif ($v->[1] eq ';' || $v->[1] eq '{' || $v->[1] eq '}') { return ''; }
	}
	return '';
}

# Whether a text looks like a SQL statement.
sub looks_like_sql
{
	my ($s) = @_;
	return $s =~ /^\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH|LOCK|TRUNCATE|VALUES)\b/
	  || $s =~ /\b(?:FROM|WHERE|SET)\b/;
}

# Check every SQL text of a C file.
sub check_c_file
{
	my ($file, $src) = @_;
	my %macros;
	my @t = c_tokens($src, 1, \%macros);
	for (my $i = 0; $i < @t;)
	{
		my ($text, @map) = ('');
		my $start = $i;
		while ($i < @t)
		{
			my @pieces;
			if ($t[$i][0] eq 'str') { @pieces = ([ $t[$i][1], $t[$i][2] ]); $i++; }
			elsif ($t[$i][0] eq 'id' && $macros{ $t[$i][1] })
			{
				my ($p, $next) = expand_macro(\@t, $i, \%macros, $t[$i][2]);
				last unless $p;
				@pieces = @$p;
				$i = $next;
			}
			else { last; }
			for my $p (@pieces)
			{
				push @map, [ length $text, $p->[1] ];
				$text .= $p->[0];
			}
		}
		if ($i == $start) { $i++; next; }
		next unless looks_like_sql($text);
		next if enclosing_call(\@t, $start) =~ $MESSAGE_CALLS;
		print STDERR "--- $file:$map[0][1]\n$text\n" if $ENV{SQL_QUALIFIED_DUMP};
		my $lineof = sub {
			my ($off) = @_;
			my $l = $map[0][1];
			for my $m (@map) { last if $m->[0] > $off; $l = $m->[1]; }
			return $l;
		};
		check_sql($file, $text, $lineof, { c => 1 });
	}
	return;
}

# ---------------------------------------------------------------- SQL side

# Tokenize SQL: [type, value, offset, uppercase]; bodies stay whole.
sub sql_tokens
{
	my ($s, $opt) = @_;
	my @t;
	pos($s) = 0;
	while (pos($s) < length $s)
	{
		my $at = pos($s);
		if ($s =~ /\G\s+/gc) { next; }
		if ($s =~ /\G--[^\n]*/gc) { next; }
		if ($s =~ m{\G/\*.*?\*/}gcs) { next; }
		if ($s =~ /\G[Ee]'(?:[^'\\]|\\.|'')*'/gcs) { push @t, [ 'lit', '', $at ]; next; }
		if ($s =~ /\G(?:[BbXxNn]|[Uu]&)?'(?:[^']|'')*'/gcs) { push @t, [ 'lit', '', $at ]; next; }
		if ($s =~ /\G(\$([A-Za-z_]\w*)?\$)/gc)
		{
			my $tag = $1;
			my $body_at = pos($s);
			my $end = index($s, $tag, $body_at);
			$end = length $s if $end < 0;
			push @t, [ 'body', substr($s, $body_at, $end - $body_at), $body_at ];
			pos($s) = $end + length $tag;
			next;
		}
		if ($s =~ /\G((?:[Uu]&)?"(?:[^"]|"")*")/gc) { push @t, [ 'id', $1, $at, '"' ]; next; }
		if ($s =~ /\G\$\d+/gc) { push @t, [ 'param', '', $at ]; next; }
		if ($opt->{c} && $s =~ /\G%s/gc) { push @t, [ 'schema', '%s', $at ]; next; }
		if ($opt->{c} && $s =~ /\G%(?:l{0,2}|z|h)?[diuxX]/gc) { push @t, [ 'num', '', $at ]; next; }
		if ($s =~ /\G\@extschema\@/gc) { push @t, [ 'schema', '@extschema@', $at ]; next; }
		if ($s =~ /\G(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+)/gc) { push @t, [ 'num', $1, $at ]; next; }
		if ($s =~ /\G([A-Za-z_\x80-\xff][\w\$\x80-\xff]*)/gc) { push @t, [ 'id', $1, $at, uc $1 ]; next; }
		if ($s =~ /\G(::|:=|=>)/gc) { push @t, [ 'p', $1, $at ]; next; }
		if ($s =~ /\G([-+*\/<>=~!\@#%^&|`?]+)/gc)
		{
			my $op = $1;
			$op =~ s/%%/%/g if $opt->{c};
			# A multi-character operator cannot end in + or - unless it
			# holds one of ~ ! @ # % ^ & | ` ? (as PostgreSQL's lexer).
			if (length $op > 1 && $op !~ /[~!\@#%^&|`?]/)
			{
				my $keep = $op =~ s/[-+]+$//r;
				$keep = substr($op, 0, 1) if $keep eq '';
				pos($s) = $at + length $keep;
				($op = $keep) =~ s/%%/%/g;
			}
			push @t, [ 'op', $op, $at ];
			next;
		}
		if ($s =~ /\G([(),;\[\].:])/gc) { push @t, [ 'p', $1, $at ]; next; }
		$s =~ /\G./gcs;
	}
	for (@t) { $_->[3] //= ''; }
	return @t;
}

# Whether token $x is the punctuation $p.
sub is_p { my ($x, $p) = @_; return $x && $x->[0] eq 'p' && $x->[1] eq $p; }

# Whether token $x is the keyword $k (one of a list).
sub is_kw
{
	my ($x, @k) = @_;
	return 0 unless $x && $x->[0] eq 'id' && $x->[3] ne '"';
	for (@k) { return 1 if $x->[3] eq $_; }
	return 0;
}

# Whether a token ends an operand (so a following - or * is binary).
sub is_operand
{
	my ($x) = @_;
	return 0 unless $x;
	return 1 if $x->[0] =~ /^(?:lit|param|num|schema)$/;
	return 1 if is_p($x, ')') || is_p($x, ']');
	return 1 if $x->[0] eq 'id' && !($EXPR_KW{ $x->[3] } || $x->[3] eq 'SELECT');
	return 0;
}

# Index of the ")" matching the "(" at $i.
sub matching
{
	my ($t, $i) = @_;
	my $d = 0;
	for (my $j = $i; $j < @$t; $j++)
	{
		$d++ if is_p($t->[$j], '(');
		return $j if is_p($t->[$j], ')') && --$d == 0;
	}
	return $#$t;
}

# Names of the WITH queries of a text.
sub cte_names
{
	my ($t) = @_;
	my %n;
	for my $i (0 .. $#$t - 1)
	{
		next unless $t->[$i][0] eq 'id';
		my $j = $i + 1;
		$j = matching($t, $j) + 1 if is_p($t->[$j], '(');
		next unless is_kw($t->[$j], 'AS');
		my $k = $j + 1;
		$k++ if is_kw($t->[$k], 'NOT');
		$k++ if is_kw($t->[$k], 'MATERIALIZED');
		$n{ lc $t->[$i][1] } = 1 if is_p($t->[$k], '(');
	}
	return \%n;
}

# Check one SQL text; $lineof maps an offset to a line.
sub check_sql
{
	my ($file, $text, $lineof, $opt) = @_;
	my @t = sql_tokens($text, $opt);
	my $st = { t => \@t, ctes => cte_names(\@t), opt => $opt, file => $file, lineof => $lineof };
	$st->{rep} = sub { report($file, $lineof->($_[0][2]), $_[1]); };
	reset_statement($st);

	for ($st->{i} = 0; $st->{i} < @t; $st->{i}++)
	{
		my $x = $t[ $st->{i} ];
		if ($x->[0] eq 'body')
		{
			my $base = $x->[2];
			check_sql($file, $x->[1], sub { $lineof->($base + $_[0]) }, $opt);
		}
		elsif (is_p($x, '::') || (is_kw($x, 'AS') && $st->{stack}[-1]{kind} eq 'CAST'))
		{
			check_cast($st) if $opt->{c};
		}
		elsif ($x->[0] eq 'p') { track_punct($st, $x->[1]); }
		elsif ($x->[0] eq 'op') { check_operator($st); }
		elsif ($x->[0] eq 'id') { check_word($st); }
	}
	return;
}

# Forget the clauses of the previous statement.
sub reset_statement
{
	my ($st) = @_;
	@$st{qw(set from raise diag stmt_kw last_clause chain)} = (undef, undef, 0, 0, '', '', {});
	$st->{stack} = [ { kind => '' } ];		# one entry per open parenthesis
	return;
}

# Follow parentheses, commas and statement ends.
sub track_punct
{
	my ($st, $p) = @_;
	my ($t, $i, $stack) = ($st->{t}, $st->{i}, $st->{stack});
	my $prev = $i > 0 ? $t->[ $i - 1 ] : undef;
	my $depth = $#$stack;
	delete $st->{chain}{$depth} if $p eq ',';
	delete $st->{chain}{ $depth + 1 } if $p eq '(';
	if ($p eq ';') { reset_statement($st); }
	elsif ($p eq '(')
	{
		# SET (opt = v) and WITH (opt = v) are options, not comparisons.
		push @$stack, {
			kind => $prev && $prev->[0] eq 'id' ? $prev->[3] : '',
			options => is_kw($prev, 'SET', 'WITH') && $i + 2 < @$t && $t->[ $i + 1 ][0] eq 'id'
			  && $t->[ $i + 2 ][0] eq 'op' && $t->[ $i + 2 ][1] eq '=' };
	}
	elsif ($p eq ')')
	{
		pop @$stack if @$stack > 1;
		$st->{set} = undef if $st->{set} && $st->{set}{depth} > $#$stack;
		$st->{from} = undef if defined $st->{from} && $st->{from} > $#$stack;
	}
	elsif ($p eq ',')
	{
		$st->{set}{want} = 1 if $st->{set} && $st->{set}{depth} == $depth;
		check_relation($st, $i + 1) if defined $st->{from} && $st->{from} == $depth;
	}
	return;
}

# The type after :: or CAST(x AS must be qualified.
sub check_cast
{
	my ($st) = @_;
	my ($t, $i) = ($st->{t}, $st->{i});
	my $n = $t->[ $i + 1 ];
	return unless $n && $n->[0] ne 'p';
	return if $n->[0] eq 'schema' && is_p($t->[ $i + 2 ], '.');
	return if $n->[0] eq 'id' && lc $n->[1] eq 'pg_catalog' && is_p($t->[ $i + 2 ], '.');
	$st->{rep}->($t->[$i], "cast to unqualified type $n->[1]") if $n->[0] eq 'id';
	return;
}

# An operator token must be OPERATOR(pg_catalog.op), unless it is syntax.
sub check_operator
{
	my ($st) = @_;
	my ($t, $i) = ($st->{t}, $st->{i});
	my ($x, $prev, $next) = ($t->[$i], $i > 0 ? $t->[ $i - 1 ] : undef, $t->[ $i + 1 ]);
	my $op = $x->[1];
	my $set = $st->{set};
	# After OPERATOR(schema.op) comes an operand, as after a bare operator.
	my $operand = is_operand($prev) && !($i >= 6 && is_kw($t->[ $i - 6 ], 'OPERATOR'));
	return if $op eq '*' && !$operand;
	return if $op eq '-' && !$operand && $next && $next->[0] eq 'num';
	if ($op eq '=')
	{
		return if $st->{stack}[-1]{options};
		if ($set && $set->{depth} == $#{ $st->{stack} } && $set->{want}) { $set->{want} = 0; return; }
		return if $st->{raise} && $prev && $prev->[0] eq 'id' && $RAISE_OPTS{ $prev->[3] };
		return if $st->{diag};
	}
	$st->{rep}->($x, "unqualified operator $op (write OPERATOR(pg_catalog.$op))");
	return;
}

# A word: OPERATOR(), a qualified name, a keyword hiding an operator, a
# call, a clause.
sub check_word
{
	my ($st) = @_;
	my ($t, $i) = ($st->{t}, $st->{i});
	my ($x, $prev, $next) = ($t->[$i], $i > 0 ? $t->[ $i - 1 ] : undef, $t->[ $i + 1 ]);
	my $kw = $x->[3];

	if ($kw eq 'OPERATOR' && is_p($next, '('))
	{
		my ($s, $dot, $op, $close) = @$t[ $i + 2 .. $i + 5 ];
		my $ok = $s && (($s->[0] eq 'id' && lc $s->[1] eq 'pg_catalog') || $s->[0] eq 'schema')
		  && is_p($dot, '.') && $op && $op->[0] eq 'op' && is_p($close, ')');
		$st->{rep}->($x, "OPERATOR() without pg_catalog") unless $ok;
		check_precedence($st, $x, $op->[1]) if $ok;
		$st->{i} += $ok ? 5 : 1;
		return;
	}
	if (is_p($prev, '.'))
	{
		check_unnest($st) if lc $x->[1] eq 'unnest' && is_p($next, '(');
		return;
	}
	delete $st->{chain}{ $#{ $st->{stack} } } if $kw ne '"' && ($EXPR_KW{$kw} || $CLAUSE_END{$kw} || $BOUNDARY{$kw});
	check_hidden_operator($st) if $kw ne '"';
	check_call($st) if is_p($next, '(') && !($kw ne '"' && $NOT_CALLS{$kw});
	track_clause($st) if $kw ne '"';
	return;
}

# The precedence the grammar gives each operator name; OPERATOR() has one.
sub op_precedence
{
	my ($op) = @_;
	return 7 if $op eq '^';
	return 6 if $op =~ m{^[*/%]$};
	return 5 if $op =~ /^[-+]$/;
	return 3 if $op =~ /^(?:[<>=]|<=|>=|<>|!=)$/;
	return 4;
}

# Every OPERATOR() has the precedence of "any other operator", left to
# right: "a OPERATOR(pg_catalog.<) b OPERATOR(pg_catalog.-) c" groups as
# "(a < b) - c".  Report an OPERATOR() that binds tighter by its bare name
# than the previous one of the same expression at the same depth.
sub check_precedence
{
	my ($st, $x, $op) = @_;
	my $depth = $#{ $st->{stack} };
	my $before = $st->{chain}{$depth};
	$st->{rep}->($x, "OPERATOR(pg_catalog.$op) after OPERATOR(pg_catalog.$before->[0]) groups as "
		  . "(a $before->[0] b) $op c: OPERATOR() has one precedence, parenthesize")
	  if $before && op_precedence($op) > op_precedence($before->[0]);
	$st->{chain}{$depth} = [$op];
	return;
}

# Only a bare unnest(a, b) is expanded to ROWS FROM (unnest(a), unnest(b)):
# pg_catalog.unnest takes one array.
sub check_unnest
{
	my ($st) = @_;
	my ($t, $i) = ($st->{t}, $st->{i});
	my ($d, $close) = (0, matching($t, $i + 1));
	for my $k ($i + 2 .. $close - 1)
	{
		$d++ if is_p($t->[$k], '(') || is_p($t->[$k], '[');
		$d-- if is_p($t->[$k], ')') || is_p($t->[$k], ']');
		if ($d == 0 && is_p($t->[$k], ','))
		{
			$st->{rep}->($t->[$i], "a qualified unnest() takes one array "
				  . "(write ROWS FROM (pg_catalog.unnest(a), pg_catalog.unnest(b)))");
			last;
		}
	}
	return;
}

# Constructs that look up an operator by its bare name.
sub check_hidden_operator
{
	my ($st) = @_;
	my ($t, $i, $rep) = ($st->{t}, $st->{i}, $st->{rep});
	my ($x, $prev, $next) = ($t->[$i], $i > 0 ? $t->[ $i - 1 ] : undef, $t->[ $i + 1 ]);
	my $kw = $x->[3];
	my $why = ' looks up an operator through the search_path';
	$rep->($x, "$kw$why (use OPERATOR(pg_catalog.~~))") if $kw =~ /^(?:LIKE|ILIKE)$/;
	$rep->($x, "SIMILAR TO$why") if $kw eq 'SIMILAR';
	$rep->($x, "BETWEEN looks up >= and <= through the search_path") if $kw eq 'BETWEEN';
	$rep->($x, "OVERLAPS looks up a function through the search_path") if $kw eq 'OVERLAPS';
	$rep->($x, "IN (...) looks up = through the search_path (use OPERATOR(pg_catalog.=) ANY)")
	  if $kw eq 'IN' && is_p($next, '(');
	$rep->($x, "IS DISTINCT FROM looks up = through the search_path")
	  if $kw eq 'DISTINCT' && (is_kw($prev, 'IS') || (is_kw($prev, 'NOT') && is_kw($t->[ $i - 2 ], 'IS')));
	$rep->($x, "NULLIF() looks up = through the search_path (write a CASE with OPERATOR(pg_catalog.=))")
	  if $kw eq 'NULLIF' && is_p($next, '(');
	$rep->($x, "CASE x WHEN looks up = through the search_path (write CASE WHEN x OPERATOR(pg_catalog.=) ...)")
	  if $kw eq 'CASE' && $next && !is_kw($next, 'WHEN');
	$rep->($x, "NATURAL JOIN looks up = through the search_path") if $kw eq 'NATURAL';
	$rep->($x, "JOIN ... USING looks up = through the search_path (write ON ... OPERATOR(pg_catalog.=))")
	  if $kw eq 'USING' && is_p($next, '(') && $st->{last_clause} eq 'JOIN';
	return;
}

# A call of a function by its bare name (not an alias's column list, not a
# WITH query's).
sub check_call
{
	my ($st) = @_;
	my ($t, $i) = ($st->{t}, $st->{i});
	my ($x, $prev) = ($t->[$i], $i > 0 ? $t->[ $i - 1 ] : undef);
	my $alias = $prev
	  && (($prev->[0] eq 'id' && !$EXPR_KW{ $prev->[3] })
		|| is_p($prev, ')') || is_p($prev, ']') || $prev->[0] eq 'schema');
	my $close = matching($t, $i + 1);
	my $cte = (is_kw($prev, 'WITH', 'RECURSIVE') || is_p($prev, ','))
	  && is_kw($t->[ $close + 1 ], 'AS') && is_p($t->[ $close + 2 ], '(');
	$st->{rep}->($x, "unqualified function $x->[1]()") unless $alias || $cte;
	return;
}

# Follow clauses (SET lists, FROM lists, RAISE, ...) and check the
# relations they name.
sub track_clause
{
	my ($st) = @_;
	my ($t, $i) = ($st->{t}, $st->{i});
	my ($x, $prev, $next) = ($t->[$i], $i > 0 ? $t->[ $i - 1 ] : undef, $t->[ $i + 1 ]);
	my $kw = $x->[3];
	my $depth = $#{ $st->{stack} };
	$st->{stmt_kw} = $kw if $st->{stmt_kw} eq '';
	$st->{raise} = 1 if $kw eq 'RAISE';
	$st->{diag} = 1 if $kw eq 'DIAGNOSTICS';
	if ($CLAUSE_END{$kw})
	{
		$st->{set} = undef if $st->{set} && $st->{set}{depth} == $depth;
		$st->{from} = undef if defined $st->{from} && $st->{from} == $depth;
	}
	$st->{last_clause} = $kw if $kw =~ /^(?:JOIN|FROM|WHERE|SELECT|DELETE|UPDATE|INSERT|SET|ON)$/;
	if ($kw eq 'SET' && !is_kw($prev, 'IS'))
	{
		$st->{set} = { depth => $depth, want => 1 };
		return;
	}
	return if $st->{stmt_kw} =~ /^(?:GRANT|REVOKE|COMMENT)$/;
	my $rel;
	if ($kw eq 'FROM' && $st->{stack}[-1]{kind} !~ /^(?:EXTRACT|SUBSTRING|TRIM|OVERLAY|POSITION)$/
		&& !is_kw($prev, 'DISTINCT', 'ROWS'))
	{
		$rel = 1;
		$st->{from} = $depth;
	}
	$rel = 1 if $kw eq 'JOIN';
	$rel = 1 if $kw eq 'INTO' && is_kw($prev, 'INSERT', 'MERGE');
	$rel = 1 if $kw eq 'UPDATE' && !is_kw($prev, 'FOR', 'DO', 'KEY', 'NO');
	$rel = 1 if $kw =~ /^(?:LOCK|TRUNCATE)$/ && !is_kw($next, 'TABLE');
	$rel = 1 if $kw eq 'TABLE' && is_kw($prev, 'LOCK', 'TRUNCATE');
	$rel = 1 if $kw eq 'USING' && $st->{stmt_kw} eq 'DELETE' && !is_p($next, '(');
	check_relation($st, $i + 1) if $rel;
	return;
}

# Check the relation named at token $j (after FROM, JOIN, ...).
sub check_relation
{
	my ($st, $j) = @_;
	my ($t, $ctes, $rep) = ($st->{t}, $st->{ctes}, $st->{rep});
	$j++ while is_kw($t->[$j], 'ONLY', 'LATERAL');
	my $x = $t->[$j];
	return unless $x && $x->[0] eq 'id';
	return if $x->[3] ne '"' && ($NOT_CALLS{ $x->[3] } || $EXPR_KW{ $x->[3] });
	return if is_p($t->[ $j + 1 ], '.') || is_p($t->[ $j + 1 ], '(');
	return if $ctes->{ lc $x->[1] };
	$rep->($x, "unqualified relation $x->[1]");
	return;
}

# Check an install script: the whole of it, and that bodies are pinned.
sub check_sql_file
{
	my ($file, $src) = @_;
	my @starts = (0);
	push @starts, pos($src) while $src =~ /\n/g;
	my $lineof = sub {
		my ($off) = @_;
		my ($lo, $hi) = (0, $#starts);
		while ($lo < $hi)
		{
			my $mid = int(($lo + $hi + 1) / 2);
			if ($starts[$mid] <= $off) { $lo = $mid; } else { $hi = $mid - 1; }
		}
		return $lo + 1;
	};
	# psql's backslash lines are not SQL.
	(my $text = $src) =~ s/^(\\[^\n]*)/' ' x length $1/gme;
	check_sql($file, $text, $lineof, {});

	# Every SQL or plpgsql function pins its search_path.
	my @t = sql_tokens($text, {});
	my ($fn, $pinned, $lang, $fn_at);
	for (my $i = 0; $i < @t; $i++)
	{
		my $x = $t[$i];
		if (is_kw($x, 'FUNCTION') && is_kw($t[ $i - 1 ], 'CREATE', 'REPLACE'))
		{
			($fn, $pinned, $lang, $fn_at) = ($t[ $i + 3 ] ? $t[ $i + 3 ][1] : '?', 0, '', $x->[2]);
		}
		next unless defined $fn;
		$lang = lc $t[ $i + 1 ][1] if is_kw($x, 'LANGUAGE') && $t[ $i + 1 ];
		$pinned = 1 if is_kw($x, 'SET') && is_kw($t[ $i + 1 ], 'SEARCH_PATH')
		  && join(' ', map { lc($_->[1]) } @t[ $i + 3 .. $i + 5 ]) eq 'pg_catalog , pg_temp';
		if (is_p($x, ';'))
		{
			report($file, $lineof->($fn_at), "function $fn (LANGUAGE $lang) does not pin search_path = pg_catalog, pg_temp")
			  if $lang =~ /^(?:sql|plpgsql)$/ && !$pinned;
			undef $fn;
		}
	}
	return;
}

# ---------------------------------------------------------------- main

# The files checked by default: the C files, the current install script
# and the update scripts.
sub default_files
{
	open my $fh, '<', 'outbox.control' or die "outbox.control: $!\n";
	my ($version) = map { /^\s*default_version\s*=\s*'([^']+)'/ ? $1 : () } <$fh>;
	close $fh;
	die "outbox.control: no default_version\n" unless defined $version;
	return (sort(glob 'src/*.c'), "sql/outbox--$version.sql", sort(glob 'sql/outbox--*--*.sql'));
}

my @files = @ARGV ? @ARGV : default_files();
for my $file (@files)
{
	open my $fh, '<', $file or die "$file: $!\n";
	my $src = do { local $/; <$fh> };
	close $fh;
	if ($file =~ /\.sql$/) { check_sql_file($file, $src); }
	else { check_c_file($file, $src); }
}
print "$_\n" for @findings;
exit(@findings ? 1 : 0);
