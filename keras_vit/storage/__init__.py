"""The folders and files keras-vit writes and reads back: run folders, export folders, `.keras`
files (saved in memory, written atomically) and plots."""
