# 0 "src/broken.c"
# 0 "<built-in>"
# 0 "<command-line>"
# 1 "/usr/include/stdc-predef.h" 1 3 4
# 0 "<command-line>" 2
# 1 "src/broken.c"
# 1 "src/broken.h" 1
static const char *in_a_header = "SELECT FROM WHERE";
# 2 "src/broken.c" 2

static const char *fine = "EXEC queuebox.take ?, ?";
static const char *joined = "DECLARE @n INT = ?;" " SELECT"
 " @n";

static const char *broken =
 "DECLARE @n INT = ?;" " IF @n > 0" " THROW 50022, N'no', 1;"
 " SELECT @n +";
# 20 "src/broken.c"
static const char *unknown = "EXEC queuebox.give ?";
static const char *message = "could not SELECT this: not a statement";
static const char c = '"';
static const char *after_char = "SELECT 1 FROM";
