// The JVM half of torpor's Java kernel (torpor_java_kernel.py is the Jupyter half): runs cells
// with the jdk.jshell API in this JVM ("local" engine), so variables, imports, methods and
// classes stay from one cell to the next.
//
// Protocol, on the stdin/stdout this process started with: a cell is a 4-byte big-endian
// length and that many bytes of UTF-8 source; the answer is JSON lines, {"out": text} or
// {"err": text} for every write the cell made to System.out/System.err (as it happens), then
// one {"done": true, "value": text|null, "ename", "evalue", "trace": [...]} (ename null: no
// error). SIGINT stops the running cell. Environment variables start as system properties.
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public final class TorporJShell {
    private static final PrintStream PROTOCOL =
            new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    private static volatile boolean stopped;

    /** Forwards every write of a cell's System.out/err as one protocol line. */
    private static final class Forward extends OutputStream {
        private final String key;
        private final ByteArrayOutputStream pending = new ByteArrayOutputStream();

        Forward(String key) {
            this.key = key;
        }

        @Override
        public synchronized void write(int b) {
            pending.write(b);
            if (b == '\n') {
                flush();
            }
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            pending.write(b, off, len);
            flush();
        }

        @Override
        public synchronized void flush() {
            byte[] bytes = pending.toByteArray();
            int end = completeUtf8(bytes);
            if (end == 0) {
                return;
            }
            pending.reset();
            pending.write(bytes, end, bytes.length - end);
            send("{\"" + key + "\":" + json(new String(bytes, 0, end, StandardCharsets.UTF_8)) + "}");
        }
    }

    /** The length of the longest prefix that does not end inside a UTF-8 sequence. */
    static int completeUtf8(byte[] b) {
        int i = b.length;
        int back = 0;
        while (i > 0 && back < 4 && (b[i - 1] & 0xC0) == 0x80) {
            i--;
            back++;
        }
        if (i == 0) {
            return b.length;
        }
        int lead = b[i - 1] & 0xFF;
        int need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
        return need > back ? i - 1 : b.length;
    }

    static synchronized void send(String line) {
        PROTOCOL.print(line);
        PROTOCOL.print('\n');
        PROTOCOL.flush();
    }

    static String json(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20 || (c >= 0xD800 && c <= 0xDFFF) || c == 0x2028 || c == 0x2029) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }

    /** JShell shows a String value as a Java literal; a result shows the text itself. */
    static String unquote(String literal) {
        if (literal.length() < 2 || literal.charAt(0) != '"') {
            return literal;
        }
        StringBuilder out = new StringBuilder();
        for (int i = 1; i < literal.length() - 1; i++) {
            char c = literal.charAt(i);
            if (c != '\\' || i + 1 >= literal.length() - 1) {
                out.append(c);
                continue;
            }
            char e = literal.charAt(++i);
            switch (e) {
                case 'n' -> out.append('\n');
                case 't' -> out.append('\t');
                case 'r' -> out.append('\r');
                case 'b' -> out.append('\b');
                case 'f' -> out.append('\f');
                case 's' -> out.append(' ');
                case 'u' -> {
                    out.append((char) Integer.parseInt(literal.substring(i + 1, i + 5), 16));
                    i += 4;
                }
                default -> {
                    if (e >= '0' && e <= '7') {
                        int j = i;
                        while (j < i + 3 && j < literal.length() - 1 && literal.charAt(j) >= '0' && literal.charAt(j) <= '7') {
                            j++;
                        }
                        out.append((char) Integer.parseInt(literal.substring(i, j), 8));
                        i = j - 1;
                    } else {
                        out.append(e);
                    }
                }
            }
        }
        return out.toString();
    }

    private static String typeOf(Snippet s) {
        if (s instanceof ExpressionSnippet e) {
            return e.typeName();
        }
        if (s instanceof VarSnippet v && v.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
            return v.typeName();
        }
        return null;  // a declaration or statement: no value shown
    }

    private static void done(String value, String ename, String evalue, List<String> trace) {
        System.out.flush();  // the cell's output before its end
        System.err.flush();
        StringBuilder t = new StringBuilder("[");
        for (String line : trace) {
            t.append(t.length() > 1 ? "," : "").append(json(line));
        }
        send("{\"done\":true,\"value\":" + json(value) + ",\"ename\":" + json(ename)
                + ",\"evalue\":" + json(evalue) + ",\"trace\":" + t.append(']') + "}");
    }

    private static void run(JShell shell, String code) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String value = null;
        String rest = code;
        stopped = false;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
            if (!info.completeness().isComplete()) {
                done(null, "CompilationException", "incomplete input", List.of(rest.strip()));
                return;
            }
            rest = info.remaining();
            value = null;
            for (SnippetEvent event : shell.eval(info.source())) {
                if (event.causeSnippet() != null) {
                    continue;  // an update of a dependent snippet, not this one
                }
                Snippet snippet = event.snippet();
                if (event.status() == Snippet.Status.REJECTED) {
                    compileError(shell, snippet);
                    return;
                }
                if (event.exception() != null) {
                    exception(event.exception());
                    return;
                }
                if (stopped) {
                    done(null, "InterruptedException", "the execution was interrupted", List.of());
                    return;
                }
                String type = typeOf(snippet);
                if (type != null && !type.equals("void") && event.value() != null) {
                    boolean string = type.equals("String") || type.equals("java.lang.String");
                    value = string ? unquote(event.value()) : event.value();
                }
            }
        }
        done(value, null, null, List.of());
    }

    private static void compileError(JShell shell, Snippet snippet) {
        List<String> trace = new ArrayList<>();
        StringBuilder evalue = new StringBuilder();
        String source = snippet.source();
        shell.diagnostics(snippet).forEach(d -> {
            if (!d.isError()) {
                return;
            }
            String message = d.getMessage(null);
            evalue.append(evalue.length() > 0 ? "\n" : "").append(message);
            trace.add(message);
            trace.add(excerpt(source, d));
        });
        if (evalue.length() == 0) {
            evalue.append("the snippet was rejected");  // e.g. a declaration that cannot be used
        }
        done(null, "CompilationException", evalue.toString(), trace);
    }

    private static String excerpt(String source, Diag d) {
        int start = (int) Math.max(0, Math.min(d.getStartPosition(), source.length()));
        int end = (int) Math.max(start, Math.min(d.getEndPosition(), source.length()));
        int lineStart = source.lastIndexOf('\n', Math.max(0, start - 1)) + 1;
        int lineEnd = source.indexOf('\n', end);
        String line = source.substring(lineStart, lineEnd < 0 ? source.length() : lineEnd);
        int width = Math.max(1, Math.min(end, lineStart + line.length()) - start);
        return line + "\n" + " ".repeat(Math.max(0, start - lineStart)) + "^".repeat(width);
    }

    private static void exception(Exception e) {
        String ename;
        if (e instanceof EvalException ee) {
            ename = ee.getExceptionClassName();
        } else if (e instanceof UnresolvedReferenceException ure) {
            ename = "UnresolvedReferenceException";
            String what = ure.getSnippet().source().strip();
            done(null, ename, "a declaration it uses is not defined: " + what, List.of(what));
            return;
        } else {
            ename = e.getClass().getName();
        }
        List<String> trace = new ArrayList<>();
        trace.add(ename + (e.getMessage() == null ? "" : ": " + e.getMessage()));
        for (StackTraceElement frame : e.getStackTrace()) {
            trace.add("\tat " + frame);
        }
        Throwable cause = e.getCause();
        while (cause != null) {
            trace.add("Caused by: " + cause);
            cause = cause.getCause();
        }
        done(null, ename, e.getMessage() == null ? "" : e.getMessage(), trace);
    }

    public static void main(String[] args) throws IOException {
        PrintStream out = new PrintStream(new Forward("out"), true, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(new Forward("err"), true, StandardCharsets.UTF_8);
        System.setOut(out);
        System.setErr(err);
        // E2B's Java reads the sandbox's env vars as system properties (its server sets them,
        // and a cell's envs, with System.setProperty): the kernel's environment is the sandbox's,
        // so every variable is a property from the start. No JDK property name lacks a dot.
        System.getenv().forEach((name, value) -> {
            if (name.matches("[A-Za-z_][A-Za-z0-9_]*") && System.getProperty(name) == null) {
                System.setProperty(name, value);
            }
        });
        DataInputStream in = new DataInputStream(System.in);
        System.setIn(new java.io.ByteArrayInputStream(new byte[0]));  // cells never read the protocol
        try (JShell shell = JShell.builder().executionEngine("local").out(out).err(err).build()) {
            sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> {
                stopped = true;
                shell.stop();
            });
            shell.eval("if (true) {}");  // the first eval loads the compiler: now, not in a cell
            send("{\"ready\":true}");
            while (true) {
                int length;
                try {
                    length = in.readInt();
                } catch (EOFException e) {
                    return;
                }
                byte[] code = in.readNBytes(length);
                run(shell, new String(code, StandardCharsets.UTF_8));
            }
        }
    }
}
