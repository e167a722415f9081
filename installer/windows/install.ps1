<#
.SYNOPSIS
  DeepInfer installer for Windows (docs/install.md).  DeepInfer 本地 AI 助手安装程序。

.DESCRIPTION
  powershell -ExecutionPolicy Bypass -File installer\windows\install.ps1 [-Cpu] [-Model SPEC | -NoModel] [-Autostart]

  Steps (mirrored by engine/desktop/install_plan.py STEPS["windows"]; each is marked "# step: NAME"):
  python -> venv in %LOCALAPPDATA%\DeepInfer\venv -> torch (CUDA wheel for the driver's CUDA version
  from nvidia-smi, or CPU) -> CuPy (cupy-cuda12x / cupy-cuda13x) + Triton (triton-windows) -> deepinfer from this checkout
  -> model (deepinfer pull, or export from Ollama / an HF folder) -> Start-menu shortcut
  -> optional run at login (deepinfer autostart enable).
  Saved as UTF-8 WITH BOM: Windows PowerShell 5.1 reads a BOM-less UTF-8 script as ANSI and the
  non-ASCII text above breaks parsing (seed 5.16). Keep the BOM when editing.
  Run it again to upgrade in place; installer\windows\uninstall.ps1 removes it.
#>
param(
    [switch]$Cpu,                       # CPU torch build (no GPU needed; slow for 3B/7B)
    [string]$Source = "",               # checkout to install from (default: this script's repo)
    [string]$Prefix = "",               # install root (default: %LOCALAPPDATA%\DeepInfer)
    [string]$Model = "",                # qwen2.5-coder-0.5b | ollama:qwen2.5:3b | C:\path\to\hf-folder
    [switch]$NoModel,                   # skip the model (run 'deepinfer pull' later)
    [switch]$Autostart,                 # start the tray at login
    [switch]$NoShortcut,                # no Start-menu entry
    [string]$Python = "",               # e.g. "3.11" (py launcher) or C:\Python311\python.exe
    [string]$Wheels = ""                # folder with wheels to use first (pip --find-links): offline installs
)
$ErrorActionPreference = "Stop"
Set-StrictMode -Version 2

function Say([string]$msg) { Write-Host "==> $msg" }
function Warn([string]$msg) { Write-Warning $msg }
function Die([string]$msg, [string]$fix = "") {
    Write-Host "error: $msg" -ForegroundColor Red
    if ($fix) { Write-Host "fix: $fix" }
    exit 1
}
# Exit code of a native command whose stderr is dropped. PS 5.1 turns redirected native stderr into
# error records, which "Stop" would throw on: relax the preference around the call.
function Get-ExitCode([scriptblock]$block) {
    $old = $ErrorActionPreference; $ErrorActionPreference = "Continue"
    try { & $block 2>$null | Out-Null; return $LASTEXITCODE } catch { return 1 } finally { $ErrorActionPreference = $old }
}
# Run a native command; stop with a message when it fails (native errors do not throw in PS 5.1).
function Invoke-Checked([string]$what, [string]$fix, [scriptblock]$block) {
    & $block
    if ($LASTEXITCODE -ne 0) { Die "$what failed (exit code $LASTEXITCODE)" $fix }
}

if (-not $Source) { $Source = (Resolve-Path (Join-Path $PSScriptRoot "..\..")).Path }
if (-not $Prefix) { $Prefix = Join-Path $env:LOCALAPPDATA "DeepInfer" }
$Plan = Join-Path $Source "engine\desktop\install_plan.py"
if (-not (Test-Path (Join-Path $Source "pyproject.toml")) -or -not (Test-Path $Plan)) {
    Die "$Source is not a DeepInfer checkout" "pass -Source C:\path\to\deepinfer (the folder with pyproject.toml)"
}

# step: python
# Prefer 3.11/3.10: the CUDA torch wheel for Python 3.12 has been seen to hang for 20+ minutes while
# extracting torch_cuda.dll (seed 5.9).
$PyCmd = @()
if ($Python -match '^\d+\.\d+$') { $PyCmd = @("py", "-$Python") }
elseif ($Python) { $PyCmd = @($Python) }
else {
    $HasPy = [bool](Get-Command py -ErrorAction SilentlyContinue)
    foreach ($v in @("3.11", "3.10", "3.12")) {
        if ($HasPy -and (Get-ExitCode { & py "-$v" -c "import sys" }) -eq 0) { $PyCmd = @("py", "-$v"); break }
    }
    if (-not $PyCmd) { $PyCmd = @("python") }
}
$PyExe = $PyCmd[0]
$PyArgs = @($PyCmd | Select-Object -Skip 1)
if ((Get-ExitCode { & $PyExe @PyArgs -c "import sys; sys.exit(sys.version_info < (3, 10))" }) -ne 0) {
    Die "no Python 3.10+ found ($($PyCmd -join ' '))" "install Python 3.11 from python.org (tick 'py launcher'), then run this again"
}
$PyVersion = (& $PyExe @PyArgs -c "import platform; print(platform.python_version())")
Say "python: $($PyCmd -join ' ') ($PyVersion)"
if ($PyVersion -like "3.12*") { Warn "Python 3.12: if the CUDA torch install seems stuck, rerun with -Python 3.11" }

# step: venv
$Venv = Join-Path $Prefix "venv"
$VPy = Join-Path $Venv "Scripts\python.exe"
New-Item -ItemType Directory -Force -Path $Prefix | Out-Null
Set-Content -Path (Join-Path $Prefix ".deepinfer-install") -Value "source=$Source" -Encoding UTF8
if (Test-Path $VPy) { Say "venv: $Venv (exists, upgrading in place)" }
else {
    Say "venv: $Venv"
    Invoke-Checked "creating the venv" "check that $Prefix is writable" { & $PyExe @PyArgs -m venv $Venv }
}
$PipArgs = @("-m", "pip", "install", "--disable-pip-version-check")
if ($Wheels) { $PipArgs += @("--find-links", (Resolve-Path $Wheels).Path) }

# step: torch
# install_plan.py reads nvidia-smi's "CUDA Version: X.Y" and names the torch wheel and CuPy to take.
$PlanArgs = @($Plan, "torch")
if ($Cpu) { $PlanArgs += "--cpu" }
$Choice = @{}
foreach ($line in (& $PyExe @PyArgs @PlanArgs)) {
    $k, $v = $line -split "=", 2
    $Choice[$k] = $v
}
if ($Choice["note"]) { Say "torch: $($Choice['note'])" }
$Have = Get-ExitCode { & $VPy -c "import sys, torch; sys.exit(0 if ('$($Choice['variant'])' == 'cpu' or torch.version.cuda) else 1)" }
if ($Have -eq 0) { Say "torch: already present" }
else {
    Say "torch: $($Choice['spec']) ($($Choice['variant'])) from $($Choice['index_url']) (about 2.5 GB for CUDA; be patient)"
    Invoke-Checked "installing torch" "check the network; or rerun with -Cpu" {
        if ($Choice["index_ok"] -eq "1") { & $VPy @PipArgs $Choice["spec"] --extra-index-url $Choice["index_url"] }
        else { Warn "$($Choice['index_url']) is unreachable: PyPI's Windows torch is CPU-only"; & $VPy @PipArgs $Choice["spec"] }
    }
}

# step: cupy
if ($Choice["cupy"]) {
    Say "cupy: $($Choice['cupy']) (custom CUDA kernels through NVRTC)"
    & $VPy @PipArgs $Choice["cupy"]
    if ($LASTEXITCODE -ne 0) { Warn "CuPy install failed: the GPU kernels will be unavailable (run deepinfer doctor)" }
} else { Say "cupy: not needed on the CPU path" }
# Triton for the GPU prefill kernels: torch's Windows wheels do not bring it; its Windows build is the
# PyPI package triton-windows (install_plan.py TRITON_WINDOWS). Without it prompts run on torch ops.
if ($Choice["triton"]) {
    Say "triton: $($Choice['triton']) (GPU prefill kernels)"
    & $VPy @PipArgs $Choice["triton"]
    if ($LASTEXITCODE -ne 0) { Warn "Triton install failed: prompts will be processed more slowly (run deepinfer doctor)" }
}

# step: package
Say "deepinfer: from $Source"
Invoke-Checked "installing deepinfer" "see the pip error above" { & $VPy @PipArgs "$Source[tray]" }
$DeepInfer = Join-Path $Venv "Scripts\deepinfer.exe"

# step: model
if ($NoModel) { Say "model: skipped (-NoModel); later: deepinfer pull" }
else {
    $ModelCmd = @(& $VPy -m engine.desktop.install_plan model-cmd $Model)
    Say "model: deepinfer $($ModelCmd -join ' ')"
    & $DeepInfer @ModelCmd
    if ($LASTEXITCODE -ne 0) { Warn "getting the model failed; run later: deepinfer $($ModelCmd -join ' ')" }
}

# step: shortcut
# Start-menu entry runs pythonw (no console window) with "-m engine tray".
$Programs = Join-Path $env:APPDATA "Microsoft\Windows\Start Menu\Programs"
if (-not $NoShortcut) {
    $Lnk = Join-Path $Programs "DeepInfer.lnk"
    $Shell = New-Object -ComObject WScript.Shell
    $Sc = $Shell.CreateShortcut($Lnk)
    $Sc.TargetPath = Join-Path $Venv "Scripts\pythonw.exe"
    $Sc.Arguments = "-m engine tray"
    $Sc.WorkingDirectory = $env:USERPROFILE
    $Sc.Description = "DeepInfer tray"
    $Sc.Save()
    Say "shortcut: $Lnk"
}

# step: autostart
if ($Autostart) {
    Invoke-Checked "enabling autostart" "run: deepinfer autostart enable" { & $DeepInfer autostart enable }
} else { Say "autostart: off (enable with: deepinfer autostart enable)" }

Say "done. Check the install with: $DeepInfer doctor"
Say "安装完成：运行 deepinfer doctor 检查环境。"
