"""The desktop classifier's window: open, drop or paste images; top-5, timing, attention; folders.

Model loading and inference run on one worker thread (LiteRT interpreters are
not thread-safe, and one queue keeps results in order), so the window stays
responsive. Every failure lands in the red banner at the top, never a crash.
"""

import os
import threading
import traceback

import numpy as np
from PySide6.QtCore import QObject, QRunnable, QSettings, Qt, QThreadPool, Signal
from PySide6.QtGui import QAction, QImage, QKeySequence, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from keras_vit.apps.desktop import inference, overlay
from keras_vit.data.images import IMAGE_EXTENSIONS, image_files
from keras_vit.inference.runtimes import TOP_K

IMAGE_VIEW_SIZE = 440
MODEL_FILTER = "Models (*.tflite *.keras saved_model.pb);;All files (*)"
IMAGE_FILTER = "Images (" + " ".join(f"*{e}" for e in IMAGE_EXTENSIONS) + ");;All files (*)"
FOLDER_COLUMNS = ("File", "Top-1", "Probability (%)", "Top-5", "Time (ms)", "Error")


def error_message(error):
    """One readable line for the banner: our own errors as they are, others with their type."""
    if isinstance(error, (ValueError, FileNotFoundError, PermissionError)):
        return str(error)
    return f"Unexpected {type(error).__name__}: {error}"


class _TaskSignals(QObject):
    done = Signal(object)
    failed = Signal(str)
    progress = Signal(object)


class _Task(QRunnable):
    """Runs `function(report)` on the worker thread; `report(value)` emits progress."""

    def __init__(self, function):
        super().__init__()
        self.function = function
        self.signals = _TaskSignals()

    def run(self):
        try:
            result = self.function(self.signals.progress.emit)
        except (ValueError, FileNotFoundError, PermissionError) as error:  # bad input: the message says it
            self.signals.failed.emit(error_message(error))
        except Exception as error:  # a bug: shown in the window, traceback on stderr, the app goes on
            traceback.print_exc()
            self.signals.failed.emit(error_message(error))
        else:
            self.signals.done.emit(result)


def to_pixmap(image):
    """RGB uint8 `(height, width, 3)` -> QPixmap."""
    image = np.ascontiguousarray(image)
    height, width, _ = image.shape
    qimage = QImage(image.data, width, height, 3 * width, QImage.Format.Format_RGB888)
    return QPixmap.fromImage(qimage.copy())  # copy: the QImage must not outlive the array


def from_qimage(qimage):
    """QImage (a pasted picture) -> RGB uint8 `(height, width, 3)`."""
    qimage = qimage.convertToFormat(QImage.Format.Format_RGB888)
    width, height, stride = qimage.width(), qimage.height(), qimage.bytesPerLine()
    rows = np.frombuffer(qimage.constBits(), np.uint8, count=stride * height).reshape(height, stride)
    return rows[:, : 3 * width].reshape(height, width, 3).copy()


class MainWindow(QMainWindow):
    """The app's one window. Signals tell tests (and scripts) when work is shown."""

    model_loaded = Signal(object)
    prediction_shown = Signal(object)
    folder_progress = Signal(int, int)
    folder_finished = Signal(list)
    error_shown = Signal(str)

    def __init__(self, settings=None):
        super().__init__()
        self.settings = settings if settings is not None else QSettings("keras-vit", "desktop")
        self.model = None
        self.prediction = None
        self.rows = []
        self._image = None  # the last image, re-classified when another model loads
        self._tasks = set()  # running tasks: keeps their signal objects alive
        self._cancel = threading.Event()
        self._folder_title = ""
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self.setWindowTitle("keras-vit classifier")
        self.setAcceptDrops(True)
        self._build_actions()
        self._build_layout()
        self.resize(1040, 660)

    # === Layout ===

    def _build_actions(self):
        toolbar = self.addToolBar("Main")
        toolbar.setMovable(False)
        for text, shortcut, slot in (
            ("Open model…", "Ctrl+M", self._choose_model),
            ("Open image…", QKeySequence.StandardKey.Open, self._choose_image),
            ("Open folder…", "Ctrl+Shift+O", self._choose_folder),
            ("Paste", QKeySequence.StandardKey.Paste, self.paste),
        ):
            action = QAction(text, self)
            action.setShortcut(QKeySequence(shortcut))
            action.triggered.connect(slot)
            toolbar.addAction(action)
            self.addAction(action)

    def _build_layout(self):
        self.banner = QLabel()
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("background:#fde2e1; color:#8a1c14; padding:8px; border-radius:4px;")
        self.banner.hide()
        self.model_label = QLabel("No model: open a .tflite, a SavedModel folder or a .keras file.")
        self.model_label.setStyleSheet("color:#444;")

        self.image_view = QLabel("Open, drop or paste an image")
        self.image_view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.image_view.setMinimumSize(IMAGE_VIEW_SIZE, IMAGE_VIEW_SIZE)
        self.image_view.setStyleSheet("background:#f4f4f4; border:1px dashed #bbb; color:#777;")
        self.class_labels, self.bars = [], []
        results = QGridLayout()
        for rank in range(TOP_K):
            label = QLabel("")
            label.setMinimumWidth(160)
            bar = QProgressBar()
            bar.setRange(0, 1000)
            bar.setValue(0)
            bar.setTextVisible(True)
            bar.setFormat("")
            bar.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            results.addWidget(label, rank, 0)
            results.addWidget(bar, rank, 1)
            self.class_labels.append(label)
            self.bars.append(bar)
        self.class_labels[0].setStyleSheet("font-weight:bold;")
        self.time_label = QLabel("")
        self.attention_box = QCheckBox("Show attention (rollout from [cls])")
        self.attention_box.setChecked(True)
        self.attention_box.toggled.connect(self._show_image)
        right = QVBoxLayout()
        right.addWidget(QLabel("<b>Top 5</b>"))
        right.addLayout(results)
        right.addWidget(self.time_label)
        right.addWidget(self.attention_box)
        right.addStretch(1)
        image_tab = QWidget()
        image_layout = QHBoxLayout(image_tab)
        image_layout.addWidget(self.image_view, 3)
        image_layout.addLayout(right, 2)

        self.folder_label = QLabel("Open or drop a folder to classify every image in it.")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_folder)
        self.csv_button = QPushButton("Export CSV…")
        self.csv_button.setEnabled(False)
        self.csv_button.clicked.connect(self._choose_csv)
        self.folder_bar = QProgressBar()
        self.table = QTableWidget(0, len(FOLDER_COLUMNS))
        self.table.setHorizontalHeaderLabels(FOLDER_COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.setSortingEnabled(True)
        self.table.cellDoubleClicked.connect(self._open_row)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.folder_label, 1)
        folder_row.addWidget(self.cancel_button)
        folder_row.addWidget(self.csv_button)
        folder_tab = QWidget()
        folder_layout = QVBoxLayout(folder_tab)
        folder_layout.addLayout(folder_row)
        folder_layout.addWidget(self.folder_bar)
        folder_layout.addWidget(self.table)

        self.tabs = QTabWidget()
        self.tabs.addTab(image_tab, "Image")
        self.tabs.addTab(folder_tab, "Folder")
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.addWidget(self.banner)
        layout.addWidget(self.model_label)
        layout.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

    # === Messages ===

    def show_error(self, message):
        self.banner.setText(message)
        self.banner.show()
        self.statusBar().showMessage("Error", 5000)
        self.error_shown.emit(message)

    def clear_error(self):
        self.banner.hide()
        self.banner.setText("")

    def error_text(self):
        """The message in the banner; empty when there is none."""
        return self.banner.text()

    # === Work on the worker thread ===

    def _submit(self, function, done, failed=None, progress=None):
        task = _Task(function)
        self._tasks.add(task)

        def finish(handler):
            def slot(value):
                self._tasks.discard(task)
                handler(value)

            return slot

        task.signals.done.connect(finish(done))
        task.signals.failed.connect(finish(failed or self.show_error))
        if progress is not None:
            task.signals.progress.connect(progress)
        task.setAutoDelete(False)  # the Python object owns it: its signals outlive run()
        self._pool.start(task)
        return task

    def wait(self, milliseconds=-1):
        """Blocks until queued work is done (for scripts and the screenshot mode)."""
        return self._pool.waitForDone(milliseconds)

    # === Models ===

    def load_model(self, path):
        """Loads a model on the worker thread; the current image is classified again with it."""
        path = os.fspath(path)
        self.statusBar().showMessage(f"Loading {path} …")
        self._submit(lambda report: inference.LoadedModel.open(path), self._model_ready)

    def _model_ready(self, model):
        self.clear_error()
        self.model = model
        self.settings.setValue("last_model", os.path.abspath(model.path))
        self.settings.sync()
        attention = (
            f"attention from {model.attention_source}" if model.has_attention else "no attention output"
        )
        self.model_label.setText(f"<b>Model</b>: {model.describe()} · {attention}")
        self.attention_box.setEnabled(model.has_attention)
        self.attention_box.setToolTip(
            ""
            if model.has_attention
            else "This model has no attention output: open the .keras model, or export with "
            "`keras-vit export --attention` and open the model.tflite beside model_attention.tflite."
        )
        self.statusBar().showMessage(f"Loaded {model.path}", 5000)
        self.model_loaded.emit(model)
        if self._image is not None:
            self.classify_image(self._image)

    def last_model(self):
        """The model used last time, if its file still exists."""
        path = self.settings.value("last_model", "")
        return path if path and os.path.exists(path) else None

    # === Single images ===

    def classify_path(self, path):
        """Reads and classifies one image file on the worker thread."""
        path = os.fspath(path)
        self.tabs.setCurrentIndex(0)

        def work(report):
            from keras_vit.data.images import load_image

            image = load_image(path)
            return image, self._classify(image)

        self._submit(work, self._prediction_ready)

    def classify_image(self, image):
        """Classifies RGB uint8 pixels (a pasted picture) on the worker thread."""
        self.tabs.setCurrentIndex(0)
        self._submit(lambda report: (image, self._classify(image)), self._prediction_ready)

    def _classify(self, image):
        if self.model is None:
            raise ValueError("Open a model first (Open model…, or drop a .tflite on the window).")
        return self.model.classify(image)

    def _prediction_ready(self, result):
        image, prediction = result
        self._image = image
        self.prediction = prediction
        self.clear_error()
        for rank, (label, bar) in enumerate(zip(self.class_labels, self.bars, strict=True)):
            if rank < len(prediction.top_k):
                name, probability = prediction.top_k[rank]
                label.setText(name)
                bar.setValue(round(1000 * probability))
                bar.setFormat(f"{100 * probability:.1f}%")
            else:
                label.setText("")
                bar.setValue(0)
                bar.setFormat("")
        self.time_label.setText(f"Inference: {prediction.milliseconds:.2f} ms ({self.model.kind})")
        self._show_image()
        self.prediction_shown.emit(prediction)

    def _show_image(self):
        if self.prediction is None:
            return
        image = self.prediction.image
        if self.attention_box.isChecked() and self.prediction.attention is not None:
            image = overlay.blend(image, self.prediction.attention)
        pixmap = to_pixmap(image).scaled(
            IMAGE_VIEW_SIZE,
            IMAGE_VIEW_SIZE,
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
        self.image_view.setPixmap(pixmap)

    # === Folders ===

    def classify_folder(self, folder_or_files):
        """Classifies every image in a folder (or a list of files) into the table; cancellable."""
        try:
            if isinstance(folder_or_files, (list, tuple)):
                files = [os.fspath(f) for f in folder_or_files]
                title = f"{len(files)} files"
            else:
                files = image_files(folder_or_files)
                title = os.fspath(folder_or_files)
            if self.model is None:
                raise ValueError("Open a model first (Open model…, or drop a .tflite on the window).")
        except (ValueError, FileNotFoundError) as error:
            self.show_error(str(error))
            return
        self.clear_error()
        self.tabs.setCurrentIndex(1)
        self.rows = []
        self.table.setSortingEnabled(False)
        self.table.setRowCount(0)
        self._folder_title = title
        self.folder_label.setText(f"{title}: {len(files)} images")
        self.folder_bar.setRange(0, len(files))
        self.folder_bar.setValue(0)
        self.cancel_button.setEnabled(True)
        self.csv_button.setEnabled(False)
        self._cancel.clear()
        model = self.model

        def work(report):
            for path in files:
                if self._cancel.is_set():
                    break
                try:
                    prediction = model.classify_file(path, with_attention=False)
                    report(inference.csv_row(path, prediction))
                except (ValueError, FileNotFoundError) as error:
                    report(inference.csv_row(path, error=str(error)))
            return len(files)

        self._submit(work, self._folder_done, failed=self._folder_failed, progress=self._add_row)

    def _add_row(self, row):
        self.rows.append(row)
        index = self.table.rowCount()
        self.table.insertRow(index)
        values = (
            os.path.basename(row["file"]),
            row["top1"],
            round(100 * row["probability"], 2) if row["probability"] != "" else "",
            row["top5"],
            row["milliseconds"],
            row["error"],
        )
        for column, value in enumerate(values):
            item = QTableWidgetItem()
            item.setData(Qt.ItemDataRole.DisplayRole, value)  # numbers sort as numbers
            item.setData(Qt.ItemDataRole.UserRole, row["file"])
            if row["error"]:
                item.setForeground(Qt.GlobalColor.darkRed)
            self.table.setItem(index, column, item)
        self.folder_bar.setValue(len(self.rows))
        self.folder_progress.emit(len(self.rows), self.folder_bar.maximum())

    def _folder_done(self, total):
        self.table.setSortingEnabled(True)
        self.table.sortItems(0, Qt.SortOrder.AscendingOrder)  # file order until the user sorts
        self.table.resizeColumnsToContents()
        self.cancel_button.setEnabled(False)
        self.csv_button.setEnabled(bool(self.rows))
        failed = sum(1 for row in self.rows if row["error"])
        status = "cancelled" if len(self.rows) < total else "done"
        self.folder_label.setText(
            f"{self._folder_title}: {len(self.rows)} of {total} images, {status}"
            + (f", {failed} unreadable" if failed else "")
        )
        self.folder_finished.emit(list(self.rows))

    def _folder_failed(self, message):
        self._folder_done(len(self.rows))
        self.show_error(message)

    def cancel_folder(self):
        """Stops a folder run after the image in progress; the rows so far stay."""
        self._cancel.set()
        self.cancel_button.setEnabled(False)

    def export_csv(self, path):
        inference.write_csv(self.rows, path)
        self.statusBar().showMessage(f"Wrote {path}", 5000)

    def _open_row(self, row, column):
        path = self.table.item(row, 0).data(Qt.ItemDataRole.UserRole)
        self.classify_path(path)

    # === Dialogs, drag and drop, paste ===

    def _choose_model(self):
        path, _ = QFileDialog.getOpenFileName(self, "Open model", "", MODEL_FILTER)
        if path:
            # A SavedModel is a folder: its saved_model.pb stands for it in the dialog.
            self.load_model(os.path.dirname(path) if path.endswith("saved_model.pb") else path)

    def _choose_image(self):
        path, _ = QFileDialog.getOpenFileName(self, "Open image", "", IMAGE_FILTER)
        if path:
            self.classify_path(path)

    def _choose_folder(self):
        folder = QFileDialog.getExistingDirectory(self, "Classify every image in a folder")
        if folder:
            self.classify_folder(folder)

    def _choose_csv(self):
        path, _ = QFileDialog.getSaveFileName(self, "Export CSV", "predictions.csv", "CSV (*.csv)")
        if path:
            try:
                self.export_csv(path)
            except OSError as error:
                self.show_error(f"Could not write {path}: {error.strerror or error}.")

    def open_paths(self, paths):
        """What a drop does: a model loads, a folder or several files fill the table, an image
        is classified."""
        paths = [os.fspath(p) for p in paths]
        if len(paths) == 1:
            path = paths[0]
            if path.lower().endswith((".tflite", ".keras")) or os.path.exists(
                os.path.join(path, "saved_model.pb")
            ):
                self.load_model(path)
            elif os.path.isdir(path):
                self.classify_folder(path)
            else:
                self.classify_path(path)
        elif paths:
            self.classify_folder(paths)

    def paste(self):
        """Classifies the clipboard's picture, or the image files copied in a file manager."""
        from PySide6.QtWidgets import QApplication

        mime = QApplication.clipboard().mimeData()
        if mime is not None and mime.hasImage():
            image = QApplication.clipboard().image()
            if not image.isNull():
                self.classify_image(from_qimage(image))
                return
        if mime is not None and mime.hasUrls():
            self.open_paths([url.toLocalFile() for url in mime.urls() if url.isLocalFile()])
            return
        self.show_error("The clipboard holds no image: copy a picture or an image file, then paste.")

    def dragEnterEvent(self, event):  # noqa: N802 (Qt's name)
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event):  # noqa: N802 (Qt's name)
        mime = event.mimeData()
        if mime.hasUrls():
            self.open_paths([url.toLocalFile() for url in mime.urls() if url.isLocalFile()])
        elif mime.hasImage():
            self.classify_image(from_qimage(QImage(mime.imageData())))
        event.acceptProposedAction()

    def closeEvent(self, event):  # noqa: N802 (Qt's name)
        self._cancel.set()
        self._pool.waitForDone(10_000)
        super().closeEvent(event)
