# IPython kernel settings of Warren's code-interpreter template (installed as /etc/ipython/).
c = get_config()  # noqa: F821 (IPython provides it)
# Tracebacks as plain text: the SDK shows them as they come, without terminal colour codes.
c.InteractiveShell.colors = "NoColor"
# Whole reprs: a long list is not cut to "...".
c.PlainTextFormatter.max_seq_length = 0
# No history database: nothing to keep between cells but the namespace, and no SQLite thread to
# carry through checkpoints.
c.HistoryManager.enabled = False
# Extra display formats the SDK reads (DataFrame data, matplotlib charts).
c.InteractiveShellApp.exec_files = ["/opt/warren/interpreter/kernel_startup.py"]
