"""Patches the verify tests apply."""

# A change that fixes nothing: not empty, so verification runs the task's tests (an empty patch is scored
# without a run), and they fail as on the unpatched tree.
NO_FIX = """diff --git a/NOTES.txt b/NOTES.txt
new file mode 100644
--- /dev/null
+++ b/NOTES.txt
@@ -0,0 +1 @@
+a change that fixes nothing
"""
