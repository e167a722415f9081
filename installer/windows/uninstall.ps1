<#
.SYNOPSIS
  Remove DeepInfer (what installer\windows\install.ps1 made).  卸载 DeepInfer。
.DESCRIPTION
  powershell -ExecutionPolicy Bypass -File installer\windows\uninstall.ps1 [-Purge]
  Removes the run-at-login entry (Startup .lnk and HKCU Run value), the Start-menu shortcut and
  %LOCALAPPDATA%\DeepInfer (the venv). Models, config and logs stay unless -Purge.
  Steps mirrored by engine/desktop/install_plan.py UNINSTALL_STEPS["windows"]. Saved as UTF-8 WITH BOM.
#>
param(
    [string]$Prefix = "",
    [switch]$Purge                      # also delete models, config and logs
)
$ErrorActionPreference = "Stop"
function Say([string]$msg) { Write-Host "==> $msg" }
if (-not $Prefix) { $Prefix = Join-Path $env:LOCALAPPDATA "DeepInfer" }
$VPy = Join-Path $Prefix "venv\Scripts\python.exe"
$DeepInfer = Join-Path $Prefix "venv\Scripts\deepinfer.exe"
$DataDirs = @()
if (Test-Path $VPy) {  # ask the install where its data lives before deleting it
    $ErrorActionPreference = "Continue"  # PS 5.1: redirected native stderr would throw under "Stop"
    $DataDirs = @(& $VPy -c "from engine import paths; print(paths.models_dir()); print(paths.config_dir()); print(paths.log_dir())" 2>$null)
    $ErrorActionPreference = "Stop"
}

# step: autostart
if (Test-Path $DeepInfer) { & $DeepInfer autostart disable | Out-Null }  # removes the .lnk and the Run value
$Startup = Join-Path $env:APPDATA "Microsoft\Windows\Start Menu\Programs\Startup\DeepInfer.lnk"
Remove-Item -Force -ErrorAction SilentlyContinue $Startup
Remove-ItemProperty -Path "HKCU:\Software\Microsoft\Windows\CurrentVersion\Run" -Name "DeepInfer" -ErrorAction SilentlyContinue
Say "autostart: removed"

# step: shortcut
Remove-Item -Force -ErrorAction SilentlyContinue (Join-Path $env:APPDATA "Microsoft\Windows\Start Menu\Programs\DeepInfer.lnk")
Say "shortcut: removed"

# step: venv
# Only the venv and the marker: %LOCALAPPDATA%\DeepInfer is the same folder as the data dirs
# %LOCALAPPDATA%\deepinfer (Windows paths ignore case), which hold the models and config.
if (Test-Path (Join-Path $Prefix ".deepinfer-install")) {
    Remove-Item -Recurse -Force (Join-Path $Prefix "venv")
    Remove-Item -Force (Join-Path $Prefix ".deepinfer-install")
    Say "install: removed $Prefix\venv"
} elseif (Test-Path $Prefix) {
    Write-Warning "$Prefix has no .deepinfer-install marker; not deleting it"
}

# step: purge
if ($Purge) {
    foreach ($d in $DataDirs) {
        if (-not $d -or -not (Test-Path $d)) { continue }
        if ($d -match "deepinfer") { Remove-Item -Recurse -Force $d; Say "purged: $d" }
        else { Say "not deleting $d (a folder you chose via DEEPINFER_*; delete it yourself)" }
    }
} elseif ($DataDirs.Count -gt 0) {
    Say "kept your models/config/logs: $($DataDirs -join ', ') (uninstall.ps1 -Purge deletes them)"
}
if ((Test-Path $Prefix) -and -not (Get-ChildItem -Force $Prefix)) { Remove-Item -Force $Prefix }
Say "卸载完成。"
