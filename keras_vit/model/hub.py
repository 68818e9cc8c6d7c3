"""Files from a model hub, through `huggingface_hub`, each failure as one line that says what to do.

huggingface_hub owns the cache (`HF_HOME` / `HF_HUB_CACHE`), resumable downloads, ETag checks,
the endpoint (`HF_ENDPOINT`), offline mode (`HF_HUB_OFFLINE`), tokens for gated repos (`HF_TOKEN`)
and the progress bar. A download is written beside its final name and moved there when whole,
so one cut off or stopped by a full disk leaves nothing the next try mistakes for a file; that
try resumes it.
"""

import hashlib
import os
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from keras_vit.files import is_disk_full

CONFIG_FILE = "config.json"
# A repo's weights, in the order they are looked for: safetensors first (no pickle), then
# PyTorch's pickled files, read with `torch.load(weights_only=True)`.
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")
# transformers' image processor settings (mean and std), when the repo has them.
PREPROCESSOR_FILE = "preprocessor_config.json"
# How long the endpoint may take to accept a connection before it counts as unreachable, and how
# long that answer is remembered (huggingface_hub would retry a refused connection for 23 s).
CONNECT_SECONDS = 3.0
REMEMBER_SECONDS = 30.0
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")


class HubError(OSError):
    """A hub file that cannot be had: the message names the repo or file and what to do."""


class Unreachable(HubError):
    """The hub cannot be reached (or offline mode is on) and the cache lacks the file."""


def download(repo, filename, revision=None):
    """The local path of `filename` in the hub repo `repo`, from the cache or downloaded.

    Raises:
        HubError: the repo, revision or file does not exist, the network is down, offline
            mode finds it missing from the cache, or the cache's disk filled during the download.
    """
    import huggingface_hub
    from huggingface_hub import errors

    where = f"{repo}@{revision}" if revision else repo
    # An endpoint that refuses or ignores connections: the cache or one line now, not after
    # huggingface_hub's five retries.
    cache_only = not offline() and not endpoint_answers()
    try:
        return huggingface_hub.hf_hub_download(
            repo, filename, revision=revision, library_name="keras-vit", local_files_only=cache_only
        )
    except errors.GatedRepoError:
        raise HubError(
            f"{where} is gated: accept its terms on the hub, then set HF_TOKEN (or `hf auth login`)."
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"No repo {repo} on {_endpoint()}: check the name (org/repo), or set HF_TOKEN for a private one."
        ) from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{repo} has no revision {revision!r}: give a branch, tag or commit it has.") from None
    except errors.RemoteEntryNotFoundError:
        raise MissingFile(f"{where} has no file {filename}.") from None
    except errors.LocalEntryNotFoundError:
        raise Unreachable(_unreachable(where, filename)) from None
    except OSError as error:
        if is_disk_full(error):
            raise HubError(
                f"No space left in the model cache {_cache_folder()} to download {filename} of {where}: "
                f"free some space (or set HF_HUB_CACHE to a roomier folder) and run the same command "
                f"again; the download resumes."
            ) from None
        raise HubError(f"Could not download {filename} of {where} ({error}): try again.") from None
    except Exception as error:
        if not _is_network_error(error):
            raise
        raise HubError(
            f"The download of {filename} of {where} broke off ({error}): run the same command again; "
            f"it resumes where it stopped."
        ) from None


class MissingFile(HubError):
    """The repo exists and lacks the file."""


def download_first(repo, filenames, revision=None):
    """The first of `filenames` that the repo has: `(name, local path)`.

    Raises:
        HubError: it has none of them, or `download` fails.
    """
    unreachable = None
    for filename in filenames:
        try:
            return filename, download(repo, filename, revision)
        except MissingFile:
            continue
        except Unreachable as error:
            # Only the cache answers: a file missing from it may be one the repo never had.
            unreachable = unreachable or error
    if unreachable:
        raise unreachable
    where = f"{repo}@{revision}" if revision else repo
    raise HubError(f"{where} has none of {', '.join(filenames)}: it holds no weights keras-vit reads.")


# How long a URL's server may take to answer (timm's I-JEPA weights are at a URL, on no hub).
URL_SECONDS = 30.0


def download_url(url):
    """The local path of the file at `url` (weights timm has at a URL only, as its `pretrained_cfg`
    `url`), from keras-vit's folder in the hub cache or downloaded there: written beside its final
    name and moved there when whole, so a cut-off download leaves nothing behind.

    Raises:
        HubError: the server cannot be reached or answers with an error, offline mode finds the file
            missing from the cache, or the disk filled during the download.
    """
    path = url_cache_path(url)
    if os.path.isfile(path):
        return path
    if offline():
        raise Unreachable(
            f"{url} is not in the cache ({os.path.dirname(path)}) and HF_HUB_OFFLINE is set: unset "
            f"HF_HUB_OFFLINE to download it, or load it once while online."
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = tempfile.NamedTemporaryFile(dir=os.path.dirname(path), suffix=".part", delete=False)
    try:
        with part, urllib.request.urlopen(url, timeout=URL_SECONDS) as answer:
            while chunk := answer.read(1 << 20):
                part.write(chunk)
        os.replace(part.name, path)
    except (urllib.error.URLError, OSError) as error:
        if is_disk_full(error):
            raise HubError(
                f"No space left in {os.path.dirname(path)} to download {url}: free some space (or set "
                f"HF_HUB_CACHE to a roomier folder) and run the same command again."
            ) from None
        reason = getattr(error, "reason", None) or error
        raise HubError(
            f"Could not download {url} ({reason}): check the network, then run the same command again."
        ) from None
    finally:
        if os.path.exists(part.name):
            os.remove(part.name)
    return path


def url_cache_path(url):
    """Where `download_url` keeps the file at `url`: a folder per URL, the file under its own name."""
    folder = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(
        _cache_folder(), "keras-vit-urls", folder, os.path.basename(urllib.parse.urlsplit(url).path)
    )


def offline():
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


_answers = {}  # endpoint -> (whether it answered, when asked)


def forget_unanswered():
    """Forgets the endpoints remembered as not answering, when a request fails for it: the user,
    told to fix the network and try again, must get a new probe, not the answer remembered for
    `REMEMBER_SECONDS`. Within a request the answer stays remembered: a cached model on a down
    network costs one probe however often the request reads the hub."""
    for endpoint in [endpoint for endpoint, (answered, _) in _answers.items() if not answered]:
        del _answers[endpoint]


def endpoint_answers():
    """Whether the hub's endpoint accepts a TCP connection within `CONNECT_SECONDS`; remembered
    for `REMEMBER_SECONDS`. Behind a proxy the endpoint is the proxy's to reach: True."""
    endpoint = _endpoint()
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return True
    answered, asked = _answers.get(endpoint, (None, 0.0))
    if answered is not None and time.monotonic() - asked < REMEMBER_SECONDS:
        return answered
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=CONNECT_SECONDS).close()
        answered = True
    except OSError:
        answered = False
    _answers[endpoint] = (answered, time.monotonic())
    return answered


def is_cached(repo, filename=CONFIG_FILE):
    """Whether the cache holds `filename` of `repo` (its default revision)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return isinstance(found, str) and os.path.exists(found)


def is_url_cached(url):
    """Whether `download_url` has the file at `url` in the cache."""
    return os.path.isfile(url_cache_path(url))


def _is_network_error(error):
    """An error of huggingface_hub's HTTP stack (httpx and what is under it): a connection lost."""
    modules = {cls.__module__.split(".")[0] for cls in type(error).__mro__}
    return bool(modules & {"httpx", "httpx2", "httpcore", "httpcore2", "h11"})


def _unreachable(where, filename):
    if offline():
        return (
            f"{filename} of {where} is not in the cache ({_cache_folder()}) and HF_HUB_OFFLINE is set: "
            f"unset HF_HUB_OFFLINE to download it, or load it once while online."
        )
    return (
        f"Cannot reach {_endpoint()} to download {filename} of {where}, and it is not in the cache: "
        f"check the network (or HF_ENDPOINT), then run the same command again."
    )


def _endpoint():
    from huggingface_hub import constants

    return constants.ENDPOINT


def _cache_folder():
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE
